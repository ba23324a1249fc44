package main

import (
	"fmt"
	"io"
	"testing"
	"time"
)

// TestServerFlagDefaultsAreTheDocumentedBounds: `fanout worker` and `fanout
// orchestrator` with no flags and an empty environment configure the
// bounds docs/flags.md's tables state, read from the config each command
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
			{"--max-streams", bc.MaxStreams, 10_000, "flags.md:56; api.md:107; operations.md:301"},
			{"--db-pool-ledger", bc.LedgerPool, 16, "flags.md:54; operations.md:208"},
			{"--db-pool-api", bc.APIPool, 8, "flags.md:55; operations.md:210"},
			{"--sweep-interval", bc.SweepInterval, 2 * time.Second, "flags.md:19; operations.md:355"},
			{"--poll-interval", bc.PollInterval, time.Second, "flags.md:20; operations.md:358"},
			{"--health-interval", bc.HealthInterval, time.Minute, "telemetry.md:42; operations.md:183"},
			{"--unauthenticated-bytes", bc.UnauthenticatedBytes, 64 << 20, "flags.md; operations.md limits"},
			{"--unauthenticated-read-timeout", bc.UnauthenticatedReadTimeout, 10 * time.Second, "flags.md; operations.md limits"},
			{"--request-bytes", bc.RequestBytes, 320 << 20, "flags.md; operations.md Memory"},
			{"--tenant-request-bytes", bc.TenantRequestBytes, 80 << 20, "flags.md; operations.md Memory"},
			{"--request-read-timeout", bc.RequestReadTimeout, 30 * time.Second, "flags.md; operations.md limits"},
		}
	}

	t.Run("worker", func(t *testing.T) {
		c, err := parseWorker(noEnv, nil)
		if err != nil {
			t.Fatal(err)
		}
		check(t, backend(&c.sf))
		check(t, []want{
			{"--capacity", c.wc.Server.Capacity, 64, "flags.md:44"},
			{"--lease-ttl", c.wc.Server.LeaseTTL, 30 * time.Second, "flags.md:45; operations.md:87, 216"},
			{"--max-connection-age", c.wc.MaxConnectionAge, 30 * time.Second, "flags.md:46; kubernetes.md Scale"},
			{"--compress-max-tokens", c.wc.Server.CompressMaxTokens, 512, "flags.md:48"},
			{"--max-model-calls", c.prov.modelCalls, 32, "flags.md:100"},
			{"--call-timeout", c.prov.callTimeout, 2 * time.Minute, "flags.md:101"},
			{"--retry-attempts", c.prov.retryAttempts, 4, "flags.md:102"},
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
			{"--max-run-tokens", e.MaxRunTokens, 100_000_000, "api.md:79; flags.md:33"},
			{"--max-tasks", e.MaxTasks, 256, "runs.md:18; flags.md:35"},
			{"--default-concurrency", e.DefaultConcurrency, 16, "runs.md:23; flags.md:36"},
			{"--headroom", e.DefaultHeadroom, 0.7, "flags.md; operations.md Concurrency from the rate limits"},
			{"--concurrency-interval", e.ConcurrencyInterval, 5 * time.Second, "flags.md; operations.md Concurrency from the rate limits"},
			{"--max-concurrency", e.MaxConcurrency, 256, "flags.md:39"},
			{"--min-reservation", e.DefaultMinReservation, 256, "runs.md:20; flags.md:40"},
			{"--task-timeout", e.DefaultTaskTimeout, 5 * time.Minute, "flags.md:41"},
			{"--run-timeout", e.DefaultRunTimeout, 30 * time.Minute, "runs.md:24; flags.md:42"},
			{"--heartbeat-interval", e.HeartbeatInterval, 5 * time.Second, "flags.md:49; operations.md:357"},
			{"--orphan-after", e.OrphanAfter, 30 * time.Second, "flags.md:50; operations.md:197"},
		})
	})
}
