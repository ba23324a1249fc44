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

// openTenant opens tenant-a's account with limit tokens.
func (b *testBundle) openTenant(t *testing.T, limit int64) budget.Account {
	t.Helper()
	ten, err := b.ledger.OpenTenant(b.ctx, "tenant-a", limit)
	if err != nil {
		t.Fatal(err)
	}
	return ten
}

// TestSliceFlow: a task's first attempt gets its slice from the run; a call
// it pays for reserves and settles on the task alone; a call past it tops
// it up; the end of the run posts and returns every slice.
func TestSliceFlow(t *testing.T) {
	b := setup(t)
	ten := b.openTenant(t, 100_000)
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

// TestSettleBatchAnswersAsSettle: ledger_settle_batch answers as
// ledger_settle called one after another: two identical sliced runs get the
// same calls, one run's settles in one batch statement, the other's one by
// one: plain settles, a settle past its grant, a stale generation, a
// reservation named twice, one already settled (docs/ledger.md#budget-slices).
func TestSettleBatchAnswersAsSettle(t *testing.T) {
	b := setup(t)
	type call struct {
		res    int // index of the reservation
		gen    int64
		actual int64
	}
	calls := []call{{0, 1, 300}, {1, 1, 600}, {2, 2, 100}, {3, 1, 50}, {3, 1, 50}, {4, 1, 400}, {0, 1, 300}}
	answers := map[string][]string{}
	for _, runID := range []string{"one-by-one", "batched"} {
		ra := b.openSliced(t, runID, 0, 10_000, 10, 5_000, 1_000, 2)
		var ids []int64
		for i := range 5 {
			r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks[fmt.Sprintf("t%d", i%2)],
				Want: 400, Min: 1, Holder: "w", TTL: time.Minute}))
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, int64(r.ID))
		}
		var got []string
		if runID == "batched" {
			var qi, qg, qa []int64
			for _, c := range calls {
				qi, qg, qa = append(qi, ids[c.res]), append(qg, c.gen), append(qa, c.actual)
			}
			n := len(calls)
			rows, err := b.pool.Query(b.ctx, `SELECT outcome, coalesce(actual, -1), spent, overrun
				FROM ledger_settle_batch($1, $2, $3, $4, $5, $6, $7, $8)`,
				qi, qg, qa, make([]bool, n), make([]string, n), make([]int64, n), make([]int64, n), make([]*string, n))
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var o string
				var actual, spent, overrun int64
				if err := rows.Scan(&o, &actual, &spent, &overrun); err != nil {
					t.Fatal(err)
				}
				got = append(got, fmt.Sprintf("%s %d %d %d", o, actual, spent, overrun))
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
		} else {
			for _, c := range calls {
				var o string
				var actual, spent, overrun int64
				if err := b.pool.QueryRow(b.ctx, `SELECT outcome, coalesce(actual, -1), spent, overrun
					FROM ledger_settle($1, $2, $3, false)`, ids[c.res], c.gen, c.actual).Scan(&o, &actual, &spent, &overrun); err != nil {
					t.Fatal(err)
				}
				got = append(got, fmt.Sprintf("%s %d %d %d", o, actual, spent, overrun))
			}
		}
		for _, task := range []string{"t0", "t1"} {
			a := b.account(t, ra.Tasks[task])
			got = append(got, fmt.Sprintf("%s: limit %d reserved %d spent %d", task, a.Limit, a.Reserved, a.Spent))
		}
		answers[runID] = got
	}
	if fmt.Sprint(answers["batched"]) != fmt.Sprint(answers["one-by-one"]) {
		t.Fatalf("ledger_settle_batch answered\n%q\nledger_settle one by one\n%q", answers["batched"], answers["one-by-one"])
	}
	b.checkConserved(t)
}
