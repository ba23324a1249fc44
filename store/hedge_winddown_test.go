package store_test

import (
	"testing"

	"github.com/fanout/fanout/budget"
)

// TestAHedgeIsWoundDownWithItsTask: a hedged task's second attempt runs on
// an account of its own ("_hedge:" + the task id), which is wound down
// with the task (docs/budget.md#hedged-tasks): ledger_wind_down marks it
// when it marks the task, and a hedge opened for a task already wound
// down opens marked.
func TestAHedgeIsWoundDownWithItsTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "r1", 100_000, 20, 5_000, 5_000, 5_000)
	woundDown := func(id budget.AccountID) bool {
		t.Helper()
		var w bool
		if err := b.pool.QueryRow(b.ctx, `SELECT wind_down FROM account WHERE account_id = $1`, int64(id)).Scan(&w); err != nil {
			t.Fatal(err)
		}
		return w
	}
	hedges := map[string]budget.AccountID{}
	for _, id := range []string{"t1", "t2"} { // hedged before the wind-down
		h, err := b.ledger.OpenHedge(b.ctx, ra.Tasks[id], "r1", "tenant-a", 0)
		if err != nil {
			t.Fatal(err)
		}
		hedges[id] = h
	}
	if err := b.ledger.WindDown(b.ctx, "r1", 0, []string{"t0", "t1"}); err != nil {
		t.Fatal(err)
	}
	h0, err := b.ledger.OpenHedge(b.ctx, ra.Tasks["t0"], "r1", "tenant-a", 0) // after
	if err != nil {
		t.Fatal(err)
	}
	hedges["t0"] = h0
	for id, want := range map[string]bool{"t0": true, "t1": true, "t2": false} {
		if got := woundDown(hedges[id]); got != want {
			t.Errorf("the hedge of %s (wound down: %v): wind_down %v", id, want, got)
		}
	}
}
