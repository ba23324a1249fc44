package store_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
)

// openSliced opens a run whose tasks t0, t1, ... are slices of its budget
// (docs/ledger.md#budget-slices): each task's cap is taskLimit and each
// attempt begins with slice tokens carved for it.
func (b *testBundle) openSliced(t *testing.T, runID string, tenant budget.AccountID, limit, minRes, taskLimit, slice int64, n int) budget.RunAccounts {
	t.Helper()
	p := budget.OpenRunParams{RunID: runID, TenantID: "tenant-a", TenantAccount: tenant, Limit: limit, MinReservation: minRes}
	for i := range n {
		p.Tasks = append(p.Tasks, budget.TaskBudget{TaskID: fmt.Sprintf("t%d", i), Limit: taskLimit, Slice: slice})
	}
	ra, err := b.ledger.OpenRun(b.ctx, p)
	if err != nil {
		t.Fatalf("open run %s: %v", runID, err)
	}
	beginAttempts(t, b.ledger, ra)
	return ra
}

// TestSliceFlow: a task's first attempt gets its slice from the run; a call
// it pays for reserves and settles on the task alone; a call past it tops
// it up; the end of the run posts and returns every slice.
func TestSliceFlow(t *testing.T) {
	b := setup(t)
	ten, err := b.ledger.OpenTenant(b.ctx, "tenant-a", 100_000)
	if err != nil {
		t.Fatal(err)
	}
	ra := b.openSliced(t, "r1", ten.ID, 10_000, 100, 4_000, 1_000, 3)
	run := b.account(t, ra.Run.ID)
	if run.Reserved != 3_000 {
		t.Fatalf("run reserved %d after three slices of 1,000", run.Reserved)
	}
	t0 := ra.Tasks["t0"]
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: t0, Want: 600, Min: 1, Holder: "w", TTL: time.Minute, Key: "k1"}))
	if err != nil || r.Amount != 600 {
		t.Fatalf("reserve on the slice: %+v, %v", r, err)
	}
	if got := b.account(t, ra.Run.ID); got.Reserved != 3_000 || got.Spent != 0 {
		t.Fatalf("a call the slice pays for moved the run: reserved %d spent %d", got.Reserved, got.Spent)
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r.ID, Generation: r.Lease.Generation, Actual: 500}); err != nil {
		t.Fatal(err)
	}
	// 500 left in the slice: a call of 800 tops it up by at least the slice size.
	r2, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: t0, Want: 800, Min: 1, Holder: "w", TTL: time.Minute, Key: "k2"}))
	if err != nil || r2.Amount != 800 {
		t.Fatalf("reserve past the slice: %+v, %v", r2, err)
	}
	if got := b.account(t, t0); got.Limit != 2_000 {
		t.Fatalf("task slice %d after a top-up, want 1,000 + 1,000", got.Limit)
	}
	b.checkConserved(t)
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r2.ID, Generation: r2.Lease.Generation, Actual: 800}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.CloseRun(b.ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	run = b.account(t, ra.Run.ID)
	if run.State != budget.StateClosed || run.Reserved != 0 || run.Spent != 1_300 {
		t.Fatalf("closed run: %+v, want closed, reserved 0, spent 1,300", run)
	}
	if got := b.account(t, ten.ID); got.Reserved != 0 || got.Spent != 1_300 {
		t.Fatalf("tenant after the close: reserved %d spent %d", got.Reserved, got.Spent)
	}
	b.checkConserved(t)
}

func (b *testBundle) account(t *testing.T, id budget.AccountID) budget.Account {
	t.Helper()
	a, err := b.ledger.Account(b.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestFirstWaveCarvesWithinThePool: the slices of a run's first wave,
// carved together by ledger_begin_attempts in the transaction that opens
// the run, are given in account order until the pool runs out: never past
// it (docs/ledger.md#budget-slices).
func TestFirstWaveCarvesWithinThePool(t *testing.T) {
	b := setup(t)
	p := budget.OpenRunParams{RunID: "w1", TenantID: "tenant-a", Limit: 1_000, MinReservation: 10}
	for i := range 3 {
		p.Tasks = append(p.Tasks, budget.TaskBudget{TaskID: fmt.Sprintf("t%d", i), Limit: 900, Slice: 450})
	}
	ra, err := b.ledger.OpenRun(b.ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	ids := []int64{int64(ra.Tasks["t0"]), int64(ra.Tasks["t1"]), int64(ra.Tasks["t2"])}
	rows, err := b.pool.Query(b.ctx, `SELECT outcome FROM ledger_begin_attempts($1, 'w1', 'tenant-a')`, ids)
	if err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatalf("begin the first wave: %v", err)
	}
	var got []int64
	for _, id := range ids {
		got = append(got, b.account(t, budget.AccountID(id)).Limit)
	}
	if got[0] != 450 || got[1] != 450 || got[2] != 100 {
		t.Fatalf("first wave's slices %v, want [450 450 100]: in order, until the pool of 1,000 runs out", got)
	}
	if run := b.account(t, ra.Run.ID); run.Reserved != 1_000 || run.State != budget.StateOpen {
		t.Fatalf("run after the first wave: reserved %d, state %s; want 1,000 and open (a carve never exhausts)", run.Reserved, run.State)
	}
	b.checkConserved(t)
}
