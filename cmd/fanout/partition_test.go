package main

// A worker cut off from Postgres while its model calls run (issue 12): the
// calls stop before their leases end, the orchestrator's sweeper posts the
// reservations as estimated spend, and nothing is overspent (docs/operations.md#a-worker-cut-off-from-the-database, docs/ledger.md#i5-no-leaked-reservation).

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// partitionLeaseTTL is the cut-off worker's --lease-ttl: short, so that the
// leases end soon after the cut, yet long enough that a renewal (given
// TTL/3, 2s) does not time out on a busy machine before the cut.
const partitionLeaseTTL = 6 * time.Second

// partitionTasks is how many tasks the run has, each with one call in
// flight at the cut.
const partitionTasks = 4

// TestWorkerCutOffFromPostgres: the only worker reaches Postgres through a
// proxy that is cut while every task's first model call (a minute long) is
// in flight and has had its lease renewed; the orchestrator still reaches
// Postgres. Reset: every connection of the worker is reset and new ones are
// refused. BlackHoled: the connections stay open but nothing comes back, and
// new ones hang — the renewals time out instead of failing.
func TestWorkerCutOffFromPostgres(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		mode proxyMode
	}{{"Reset", reset}, {"BlackHoled", blackHoled}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testPartition(t, tc.mode)
		})
	}
}

func testPartition(t *testing.T, mode proxyMode) {
	url := storetest.NewDB(t)
	pool := openPool(t, url)
	workerURL, proxy := proxiedURL(t, url)
	w := startWorkerProc(t, workerURL, "w-cut", "--lease-ttl", partitionLeaseTTL.String(),
		"--sim-latency", "1m", "--sim-tool-calls", "1", "--sim-finish-after", "2",
		"--poll-interval", e2ePoll, "--sweep-interval", e2eSweep)
	// Heal nothing, but reset what is left before the worker is stopped, so
	// that its shutdown does not wait on black-holed connections.
	t.Cleanup(func() { proxy.cut(reset) })
	orch := startOrchestratorMain(t, url, []*workerProc{w}, "--poll-interval", e2ePoll, "--sweep-interval", e2eSweep)

	s := e2eSpec("partition", partitionTasks, 1_000_000)
	started, err := orch.client.StartRun(context.Background(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := started.GetRunId()

	// Cut once every task's call holds a lease renewed at least once: the
	// leases then end TTL after a renewal, not after the grant.
	waitFor(t, 30*time.Second, "every task's first call in flight, its lease renewed", func() (bool, string) {
		held, renewed := heldLeases(t, pool, runID)
		return renewed == partitionTasks, fmt.Sprintf("%d held, %d renewed", held, renewed)
	})
	cutIDs := heldReservations(t, pool, runID)
	proxy.cut(mode)
	cutAt := time.Now()

	waitFor(t, 20*time.Second, "the orchestrator's sweeper posting every reservation the cut-off worker held", func() (bool, string) {
		held, _ := heldLeases(t, pool, runID)
		return held == 0, fmt.Sprintf("%d still held", held)
	})
	rows := reservationRows(t, pool, runID)
	for _, id := range cutIDs {
		if r := rows[id]; r.state != "expired" || !r.estimated {
			t.Errorf("reservation %d (in flight at the cut) ended %s (estimated %v), want expired: posted by the sweeper",
				id, r.state, r.estimated)
		}
	}

	// (a) Every call ended before its lease did. The sim logs a call when it
	// ends, so a call still running has no record yet.
	byRes := map[int64]call{}
	waitFor(t, 3*time.Second, "a call record for every reservation in flight at the cut", func() (bool, string) {
		for _, c := range w.calls(t, runID) {
			byRes[c.ReservationID] = c
		}
		var running []string
		for _, id := range cutIDs {
			if _, ok := byRes[id]; !ok {
				running = append(running, fmt.Sprintf("reservation %d: lease ended %v ago", id,
					time.Since(rows[id].leaseEnd).Round(time.Millisecond)))
			}
		}
		return len(running) == 0, "calls still running after their lease ended: " + strings.Join(running, "; ")
	})
	var slack []time.Duration
	for id, c := range byRes {
		r, ok := rows[id]
		if !ok {
			t.Errorf("call of task %s names reservation %d, which is not the run's", c.TaskID, id)
			continue
		}
		if !c.End.Before(r.leaseEnd) {
			t.Errorf("call of task %s under reservation %d ended %v, %v after its lease ended (%v)",
				c.TaskID, id, c.End, c.End.Sub(r.leaseEnd), r.leaseEnd)
		}
	}
	for _, id := range cutIDs {
		c := byRes[id]
		if !c.Cancelled {
			t.Errorf("call under reservation %d was not cancelled (%+v)", id, c.CallRecord)
		}
		slack = append(slack, rows[id].leaseEnd.Sub(c.End))
	}
	sort.Slice(slack, func(i, j int) bool { return slack[i] < slack[j] })
	t.Logf("calls in flight at the cut: %d; each stopped this long before its lease ended: %v (TTL %v, margin %v)",
		len(cutIDs), slack, partitionLeaseTTL, partitionLeaseTTL/10)

	// (d) The run ends, and each task cut off says why.
	evs := watchAll(t, orch.client, runID, nil)
	t.Logf("the run ended %v after the cut", time.Since(cutAt).Round(time.Millisecond))
	fin := evs[len(evs)-1].GetRunFinished()
	if st := fin.GetState(); st == fanoutv1.RunState_RUN_STATE_UNSPECIFIED || st == fanoutv1.RunState_RUN_STATE_RUNNING {
		t.Errorf("run ended in state %s, not a final one", st)
	}
	checkOutcomes(t, s, fin.GetResult().GetTasks())
	for _, o := range fin.GetResult().GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_FAILED || !strings.Contains(o.GetSummary().GetError(), "lease") {
			t.Errorf("task %s ended %s (%q), want FAILED for the lease that could not be renewed",
				o.GetTaskId(), o.GetStatus(), o.GetSummary().GetError())
		}
	}
	t.Logf("task %s: %s", fin.GetResult().GetTasks()[0].GetTaskId(), fin.GetResult().GetTasks()[0].GetSummary().GetError())

	// (c) Conserved, within the limit.
	waitClosed(t, pool, runID)
	spent, limit := checkConserved(t, pool, runID)
	t.Logf("run spent %d of %d", spent, limit)
}

// heldLeases counts the run's held reservations, and those whose lease was
// renewed (it ends later than TTL after the grant).
func heldLeases(t testing.TB, pool *store.Pool, runID string) (held, renewed int) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT count(*),
		count(*) FILTER (WHERE lease_expires_at > created_at + make_interval(secs => $2))
		FROM reservation WHERE run_id = $1 AND state = 'held'`,
		runID, partitionLeaseTTL.Seconds()+0.2).Scan(&held, &renewed); err != nil {
		t.Fatal(err)
	}
	return held, renewed
}

func heldReservations(t testing.TB, pool *store.Pool, runID string) []int64 {
	t.Helper()
	var ids []int64
	rows, err := pool.Query(context.Background(), `SELECT reservation_id FROM reservation
		WHERE run_id = $1 AND state = 'held' ORDER BY reservation_id`, runID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(ids) != partitionTasks {
		t.Fatalf("%d held reservations at the cut, want %d (one per task)", len(ids), partitionTasks)
	}
	return ids
}

// reservationRow is what the partition test reads of a reservation.
type reservationRow struct {
	state     string
	estimated bool
	leaseEnd  time.Time // lease_expires_at: its last lease's end
}

func reservationRows(t testing.TB, pool *store.Pool, runID string) map[int64]reservationRow {
	t.Helper()
	out := map[int64]reservationRow{}
	rows, err := pool.Query(context.Background(), `SELECT reservation_id, state, estimated, lease_expires_at
		FROM reservation WHERE run_id = $1`, runID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var r reservationRow
		if err := rows.Scan(&id, &r.state, &r.estimated, &r.leaseEnd); err != nil {
			t.Fatal(err)
		}
		out[id] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
