package store_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// TestHealthReportsWhatIsWrong is the health check's positive control: on
// an honest ledger it reports accounts and nothing wrong; then exactly one
// tampered account, one reservation held past its lease and one RUNNING run
// whose heartbeat is stale, each as it is made (the owner can), through
// CheckHealth and through MonitorHealth's gauges.
func TestHealthReportsWhatIsWrong(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "health", 1000, 1, 500, 500)
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 100, Min: 1, Holder: "n", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	runs := store.NewRuns(b.pool)
	if _, _, err := runs.CreateRun(b.ctx, &fanoutv1.Run{RunId: "health", TenantId: "tenant-a", IdempotencyKey: "health",
		State: fanoutv1.RunState_RUN_STATE_RUNNING, Spec: &fanoutv1.RunSpec{}}, "o1"); err != nil {
		t.Fatal(err)
	}
	check := func(what string, want store.Health) {
		t.Helper()
		got, err := store.CheckHealth(b.ctx, b.pool, 30*time.Second, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if got.Accounts == 0 {
			t.Fatalf("%s: the check looked at no account", what)
		}
		if got.Unconserved != want.Unconserved || got.OverdueReservations != want.OverdueReservations || got.StaleRuns != want.StaleRuns {
			t.Errorf("%s: unconserved %d, overdue %d, stale %d; want %d, %d, %d", what, got.Unconserved,
				got.OverdueReservations, got.StaleRuns, want.Unconserved, want.OverdueReservations, want.StaleRuns)
		}
		if got.OldestHeartbeat < want.OldestHeartbeat {
			t.Errorf("%s: oldest heartbeat %v, want at least %v", what, got.OldestHeartbeat, want.OldestHeartbeat)
		}
		if got.OldestApproval < want.OldestApproval || (want.OldestApproval == 0 && got.OldestApproval != 0) {
			t.Errorf("%s: oldest approval %v, want %v or more (0 when none waits)", what, got.OldestApproval, want.OldestApproval)
		}
	}
	check("an honest ledger", store.Health{})

	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := b.pool.Exec(b.ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec("UPDATE account SET spent = spent + 7 WHERE account_id = $1", int64(ra.Tasks["t1"]))
	check("a balance rewritten without an entry", store.Health{Unconserved: 1})
	exec("UPDATE reservation SET lease_expires_at = now() - interval '1 minute' WHERE reservation_id = $1", int64(r.ID))
	check("a lease a minute past", store.Health{Unconserved: 1, OverdueReservations: 1})
	exec("UPDATE run SET owner_heartbeat = now() - interval '1 hour' WHERE run_id = 'health'")
	want := store.Health{Unconserved: 1, OverdueReservations: 1, StaleRuns: 1, OldestHeartbeat: time.Hour}
	check("a heartbeat an hour old", want)
	// A write that has waited half an hour for its approval.
	exec(`INSERT INTO run_tool_policy (tenant_id, run_id, tool, approval, approval_timeout_ms) VALUES ('tenant-a', 'health', 'charge', true, 3600000)`)
	var state string
	if err := b.pool.QueryRow(b.ctx, `SELECT tool_call_issue($1, 'health/t0/a1/i1/c0', 'tenant-a', 'health', 't0', 1, 1, 0, '', 'charge', $2, '{}')`,
		int64(ra.Tasks["t0"]), strings.Repeat("ab", 32)).Scan(&state); err != nil || state != "awaiting_approval" {
		t.Fatalf("record a write awaiting approval: %q, %v", state, err)
	}
	exec(`ALTER TABLE tool_call DISABLE TRIGGER tool_call_transition`)
	exec(`UPDATE tool_call SET created_at = now() - interval '30 minutes' WHERE key = 'health/t0/a1/i1/c0'`)
	exec(`ALTER TABLE tool_call ENABLE TRIGGER tool_call_transition`)
	want.OldestApproval = 30 * time.Minute
	check("a write waiting for approval for half an hour", want)

	// The gauges say the same.
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	ctx, cancel := context.WithCancel(b.ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		store.MonitorHealth(ctx, b.pool, store.HealthConfig{Interval: 50 * time.Millisecond, Meter: mp.Meter("test"), Logger: slog.New(slog.DiscardHandler)})
	})
	defer func() { cancel(); wg.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		gauges := collectGauges(t, reader)
		if gauges["fanout.ledger.accounts.unconserved"] == 1 && gauges["fanout.ledger.reservations.overdue"] == 1 &&
			gauges["fanout.runs.stale"] == 1 && gauges["fanout.runs.heartbeat.age"] >= 3600 &&
			gauges["fanout.approvals.oldest.age"] >= 1800 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gauges %v, want 1 unconserved account, 1 overdue reservation, 1 stale run, a heartbeat >= 3600s old, "+
				"an approval waiting >= 1800s", gauges)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// collectGauges returns the last value of every gauge reader has.
func collectGauges(t *testing.T, reader *sdkmetric.ManualReader) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[m.Name] = float64(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					out[m.Name] = p.Value
				}
			}
		}
	}
	return out
}

// TestHealthReportsTheNotifyQueue: the health check reports how full
// PostgreSQL's notification queue is, as a node's login may read it: a
// listening session that reads nothing (a stopped process) holds the
// notifications sent after it, and the gauge shows them.
func TestHealthReportsTheNotifyQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	nodePool, err := store.Open(b.ctx, storetest.NodeURL(t, b.url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nodePool.Close)
	stopped, err := pgx.Connect(b.ctx, b.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stopped.Close(context.Background()) })
	// A session in a transaction reads no notification until it ends: it
	// holds them as a stopped process does once its socket's buffer is
	// full.
	if _, err := stopped.Exec(b.ctx, "LISTEN fanout_health_test"); err != nil {
		t.Fatal(err)
	}
	if _, err := stopped.Exec(b.ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	// Four pages' worth of notifications (a page is 8 kB of the 8 GB).
	for i := range 4 {
		if _, err := b.pool.Exec(b.ctx, "SELECT pg_notify('fanout_health_test', $1)", fmt.Sprint(i, strings.Repeat("x", 7000))); err != nil {
			t.Fatal(err)
		}
	}
	h, err := store.CheckHealth(b.ctx, nodePool, 30*time.Second, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if h.NotifyQueueUsage <= 0 {
		t.Errorf("notify queue usage %v with a session holding 4 pages of notifications; want more than 0", h.NotifyQueueUsage)
	}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	ctx, cancel := context.WithCancel(b.ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		store.MonitorHealth(ctx, nodePool, store.HealthConfig{Interval: 50 * time.Millisecond, Meter: mp.Meter("test"), Logger: slog.New(slog.DiscardHandler)})
	})
	defer func() { cancel(); wg.Wait() }()
	for deadline := time.Now().Add(30 * time.Second); collectGauges(t, reader)["fanout.notify.queue.usage"] <= 0; {
		if time.Now().After(deadline) {
			t.Fatalf("gauges %v; want fanout.notify.queue.usage above 0", collectGauges(t, reader))
		}
		time.Sleep(20 * time.Millisecond) // polling the gauges
	}
}
