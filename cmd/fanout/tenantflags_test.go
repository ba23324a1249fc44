package main

import (
	"io"
	"testing"

	"github.com/fanout/fanout/node"
)

// TestAdmissionFlagsReachTheBackend: `fanout orchestrator` passes
// --tenant-max-streams and --unauthenticated-bytes to the backend it opens
// (issue 23 items 1 and 2), defaulting to 0 (a quarter of --max-streams)
// and node.DefaultUnauthenticatedBytes.
func TestAdmissionFlagsReachTheBackend(t *testing.T) {
	t.Parallel()
	noEnv := &Env{Stdout: io.Discard, Stderr: io.Discard, Getenv: func(string) string { return "" }}
	c, err := parseOrchestrator(noEnv, nil)
	if err != nil {
		t.Fatal(err)
	}
	if bc := c.sf.backendConfig(nil); bc.TenantMaxStreams != 0 || bc.UnauthenticatedBytes != node.DefaultUnauthenticatedBytes {
		t.Errorf("defaults: tenant %d, unauthenticated %d; want 0 and %d", bc.TenantMaxStreams, bc.UnauthenticatedBytes, node.DefaultUnauthenticatedBytes)
	}
	c, err = parseOrchestrator(noEnv, []string{"--tenant-max-streams", "7", "--unauthenticated-bytes", "1048576"})
	if err != nil {
		t.Fatal(err)
	}
	if bc := c.sf.backendConfig(nil); bc.TenantMaxStreams != 7 || bc.UnauthenticatedBytes != 1<<20 {
		t.Errorf("set: tenant %d, unauthenticated %d; want 7 and %d", bc.TenantMaxStreams, bc.UnauthenticatedBytes, 1<<20)
	}
}
