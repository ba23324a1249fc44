package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fanout/fanout/store/storetest"
)

// TestServersRefuseAnUnsafeDatabase: a worker and an orchestrator, as the
// command line starts them, refuse the test cluster (fsync,
// full_page_writes and synchronous_commit off) with each setting named and
// the flag that accepts the risk; with the flag they start
// (docs/operations.md#ha-postgresql).
func TestServersRefuseAnUnsafeDatabase(t *testing.T) {
	t.Parallel()
	url := storetest.NewDB(t)
	f := testPeer(t)
	for _, args := range [][]string{
		{"worker", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--database-url", storetest.WorkerURL(t, url),
			"--peer-tls-ca", f.CA, "--peer-tls-cert", f.Worker.Cert, "--peer-tls-key", f.Worker.Key, "--peer-verify-keys", f.VerifyKey},
		append(orchestratorArgs(t, url, []*workerProc{{addr: "127.0.0.1:1"}}), "--metrics-listen", ""),
	} {
		t.Run(args[0], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var stdout, stderr lockedBuffer
			code := Main(ctx, args, &stdout, &stderr, func(string) string { return "" })
			out := stderr.String()
			if code == 0 {
				t.Fatalf("%s started on a database with fsync off:\n%s", args[0], out)
			}
			for _, want := range []string{"fsync = off", "full_page_writes = off", "synchronous_commit = off",
				"--allow-unsafe-durability", "docs/operations.md#ha-postgresql"} {
				if !strings.Contains(out, want) {
					t.Errorf("%s's refusal does not say %q:\n%s", args[0], want, out)
				}
			}
			if strings.Contains(out, "serving") {
				t.Errorf("%s served before refusing:\n%s", args[0], out)
			}
		})
	}
}

// TestDoctorOnAnUnsafeDatabase: `fanout doctor` prints the settings and an
// UNSAFE verdict naming each problem, and exits 1.
func TestDoctorOnAnUnsafeDatabase(t *testing.T) {
	t.Parallel()
	url := storetest.NodeURL(t, storetest.NewDB(t))
	var stdout, stderr lockedBuffer
	code := Main(t.Context(), []string{"doctor", "--database-url", url}, &stdout, &stderr, func(string) string { return "" })
	out := stdout.String()
	if code != 1 {
		t.Errorf("doctor exited %d on fsync off, want 1:\n%s%s", code, out, stderr.String())
	}
	for _, want := range []string{"fsync                      off", "synchronous_commit         off (as this login sees it)",
		"roles                      fanout_app", "verdict: UNSAFE", "  - fsync = off"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor's report does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out+stderr.String(), storetest.NodeRole+":") {
		t.Errorf("doctor printed the login's password")
	}
}
