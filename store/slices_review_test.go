package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fanout/fanout/budget"
)

// TestSliceRunShortLeavesOtherRunsAlone: a run whose own pool is short
// (its tenant has plenty) does not recall the slices of the tenant's other
// runs: that would not pay its call (docs/ledger.md#budget-slices).
func TestSliceRunShortLeavesOtherRunsAlone(t *testing.T) {
	b := setup(t)
	ten := b.openTenant(t, 1_000_000)
	ra := b.openSliced(t, "rA", ten.ID, 1_000, 10, 2_000, 300, 2)
	rb := b.openSliced(t, "rB", ten.ID, 10_000, 10, 5_000, 1_000, 2)
	t.Logf("B's slices before: %v", b.taskLimits(t, rb))
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 2_000, Min: 1, Holder: "w", TTL: ttl}))
	t.Logf("A's call: amount %d err %v", r.Amount, err)
	t.Logf("B's slices after: %v (B's pool %+v)", b.taskLimits(t, rb), b.account(t, rb.Run.ID))
	if got := b.taskLimits(t, rb); got[0] != 1_000 || got[1] != 1_000 {
		t.Errorf("run B's slices were recalled by run A's own shortage: %v", got)
	}
	b.checkConserved(t)
}

// TestSliceSettleAfterACloseDoesNotDeadlock: ledger_lock_reservation
// decides "slice alone" on an unlocked read, and checks it again under the
// lock. A settle that read the
// task open while an end_run('closed') held it settles on the task's row
// alone after the mark, and ledger_resolved then posts the slice
// (ledger_uncarve: UPDATE of the run and the tenant) while holding the
// task's row, out of root-first order and without NOWAIT. An
// orchestrator's return_slices waiting on the tenant closes the cycle.
func TestSliceSettleAfterACloseDoesNotDeadlock(t *testing.T) {
	b := setup(t)
	ten := b.openTenant(t, 1_000_000)
	ra := b.openSliced(t, "r1", ten.ID, 10_000, 10, 5_000, 1_000, 2)
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 100, Min: 1, Holder: "w", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	c3, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Release()
	if _, err := c3.Exec(b.ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := c3.Exec(b.ctx, "SELECT fanout.ledger_end_run('r1', 'closed', 'review')"); err != nil {
		t.Fatal(err)
	}
	waiting := func(n int) {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			var k int
			_ = b.pool.QueryRow(b.ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()").Scan(&k)
			if k >= n {
				return
			}
		}
		t.Fatalf("fewer than %d waiting", n)
	}
	settled := make(chan error, 1)
	go func() {
		_, err := b.pool.Exec(b.ctx, "SELECT fanout.ledger_settle($1, $2, 50, false)", int64(r.ID), r.Lease.Generation)
		settled <- err
	}()
	waiting(1)
	returned := make(chan error, 1)
	go func() {
		_, err := b.pool.Exec(b.ctx, "SELECT fanout.ledger_return_slices('r1', ARRAY['t0'])")
		returned <- err
	}()
	waiting(2)
	if _, err := c3.Exec(b.ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	e1, e2 := <-settled, <-returned
	if e2 != nil {
		t.Errorf("return_slices after a close, beside a settle that waited: %v", e2)
	}
	var pgErr *pgconn.PgError
	if errors.As(e1, &pgErr) && pgErr.Code == "40001" {
		// Refused to be retried (as the store does): the retry takes the
		// chain root first.
		_, e1 = b.pool.Exec(b.ctx, "SELECT fanout.ledger_settle($1, $2, 50, false)", int64(r.ID), r.Lease.Generation)
	}
	if e1 != nil {
		t.Errorf("the settle that waited on the close: %v", e1)
	}
	b.checkConserved(t)
}

// TestSliceTopUpCountsItsOwnSlice: a top-up carves at least slice_size and
// may leave the pool below the run's minimum; the run is exhausted only
// when the pool plus every slice, the caller's included, cannot pay it
// (docs/ledger.md#budget-slices), so the caller's next call is paid.
func TestSliceTopUpCountsItsOwnSlice(t *testing.T) {
	b := setup(t)
	ra := b.openSliced(t, "r1", 0, 2_000, 100, 2_000, 500, 2)
	t0, t1 := ra.Tasks["t0"], ra.Tasks["t1"]
	if _, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: t1, Want: 500, Min: 1, Holder: "w", TTL: ttl})); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: t0, Want: 600, Min: 1, Holder: "w", TTL: ttl}))
		t.Logf("t0 call %d: %d %v", i, r.Amount, err)
	}
	a0, run := b.account(t, t0), b.account(t, ra.Run.ID)
	t.Logf("t0 %+v", a0)
	t.Logf("run %+v", run)
	if unused := a0.Limit - a0.Reserved - a0.Spent; run.State == budget.StateExhausted && unused >= run.MinReservation {
		t.Errorf("run exhausted with %d unused on t0's slice (min %d); t0 is %s", unused, run.MinReservation, a0.State)
	}
	if _, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: t0, Want: 200, Min: 100, Holder: "w", TTL: ttl})); err != nil {
		t.Errorf("t0's next call of 200 (its slice has them): %v", err)
	}
	b.checkConserved(t)
}
