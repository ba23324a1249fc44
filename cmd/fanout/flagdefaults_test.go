package main

import (
	"fmt"
	"io"
	"testing"
	"time"
)

// TestServerFlagDefaultsAreTheDocumentedBounds: `fanout worker` and `fanout
// orchestrator` with no flags and an empty environment configure the
// bounds the README's flag tables state, read from the config each command
// opens its node with (node.BackendConfig, node.WorkerConfig,
// orchestrator.Config) or, for the providers, the fields models() builds
// from. The tool loop's flags are TestToolFlags' (toolflags_test.go).
func TestServerFlagDefaultsAreTheDocumentedBounds(t *testing.T) {
	t.Parallel()
	noEnv := &Env{Stdout: io.Discard, Stderr: io.Discard, Getenv: func(string) string { return "" }}
	type want struct {
		name     string
		got, doc any
		stated   string
	}
	check := func(t *testing.T, ws []want) {
		t.Helper()
		for _, w := range ws {
			if fmt.Sprint(w.got) != fmt.Sprint(w.doc) {
				t.Errorf("%s defaults to %v, want %v (%s)", w.name, w.got, w.doc, w.stated)
			}
		}
	}
	// Every server's backend, whichever command builds it.
	backend := func(sf *serverFlags) []want {
		bc := sf.backendConfig(nil)
		return []want{
			{"--max-streams", bc.MaxStreams, 10_000, "README.md:165, 468; operations.md:301"},
			{"--db-pool-ledger", bc.LedgerPool, 16, "README.md:466; operations.md:208"},
			{"--db-pool-api", bc.APIPool, 8, "README.md:467; operations.md:210"},
			{"--sweep-interval", bc.SweepInterval, 2 * time.Second, "README.md:440; operations.md:355"},
			{"--poll-interval", bc.PollInterval, time.Second, "README.md:441; operations.md:358"},
			{"--health-interval", bc.HealthInterval, time.Minute, "README.md:551; operations.md:183"},
			{"--unauthenticated-bytes", bc.UnauthenticatedBytes, 64 << 20, "README.md flags; operations.md limits"},
			{"--unauthenticated-read-timeout", bc.UnauthenticatedReadTimeout, 10 * time.Second, "README.md flags; operations.md limits"},
			{"--request-bytes", bc.RequestBytes, 320 << 20, "README.md flags; operations.md Memory"},
			{"--tenant-request-bytes", bc.TenantRequestBytes, 80 << 20, "README.md flags; operations.md Memory"},
			{"--request-read-timeout", bc.RequestReadTimeout, 30 * time.Second, "README.md flags; operations.md limits"},
		}
	}

	t.Run("worker", func(t *testing.T) {
		c, err := parseWorker(noEnv, nil)
		if err != nil {
			t.Fatal(err)
		}
		check(t, backend(&c.sf))
		check(t, []want{
			{"--capacity", c.wc.Server.Capacity, 64, "README.md:458"},
			{"--lease-ttl", c.wc.Server.LeaseTTL, 30 * time.Second, "README.md:459; operations.md:87, 216"},
			{"--max-connection-age", c.wc.MaxConnectionAge, 30 * time.Second, "README.md flags; kubernetes.md Scale"},
			{"--compress-max-tokens", c.wc.Server.CompressMaxTokens, 512, "README.md:461"},
			{"--max-model-calls", c.prov.modelCalls, 32, "README.md:503"},
			{"--call-timeout", c.prov.callTimeout, 2 * time.Minute, "README.md:504"},
			{"--retry-attempts", c.prov.retryAttempts, 4, "README.md:505"},
		})
	})
	t.Run("orchestrator", func(t *testing.T) {
		c, err := parseOrchestrator(noEnv, nil)
		if err != nil {
			t.Fatal(err)
		}
		check(t, backend(&c.sf))
		e := c.oc.Engine
		check(t, []want{
			{"--max-run-tokens", e.MaxRunTokens, 100_000_000, "README.md:153, 449"},
			{"--max-tasks", e.MaxTasks, 256, "README.md:185, 451"},
			{"--default-concurrency", e.DefaultConcurrency, 16, "README.md:188, 452"},
			{"--headroom", e.DefaultHeadroom, 0.7, "README.md flags; operations.md Concurrency from the rate limits"},
			{"--concurrency-interval", e.ConcurrencyInterval, 5 * time.Second, "README.md flags; operations.md Concurrency from the rate limits"},
			{"--max-concurrency", e.MaxConcurrency, 256, "README.md:453"},
			{"--min-reservation", e.DefaultMinReservation, 256, "README.md:187, 454"},
			{"--task-timeout", e.DefaultTaskTimeout, 5 * time.Minute, "README.md:455"},
			{"--run-timeout", e.DefaultRunTimeout, 30 * time.Minute, "README.md:189, 456"},
			{"--heartbeat-interval", e.HeartbeatInterval, 5 * time.Second, "README.md:462; operations.md:357"},
			{"--orphan-after", e.OrphanAfter, 30 * time.Second, "README.md:463; operations.md:197"},
		})
	})
}
