package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store/storetest"
)

// TestSetBudgetPutsOpenRunsUnderIt (issue 23, item 3; I16): a tenant
// without a budget has a run in flight, with a reservation of 300 held and
// 200 already spent; a budget of 500 a day is then set. From that commit
// the run is under the tenant's account: the held 300 counts against the
// new period and settles there, the run is granted only what the tenant
// has left, and a run opened afterwards without naming the tenant's
// account lands under it too (the admit → OpenRun race). A budget smaller
// than what is held exhausts the tenant, and its runs, at once.
func TestSetBudgetPutsOpenRunsUnderIt(t *testing.T) {
	t.Parallel()
	t.Run("under the budget from its commit", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ra, err := b.ledger.OpenRun(b.ctx, budget.OpenRunParams{RunID: "early", TenantID: "globex", Limit: 100_000,
			MinReservation: 10, Tasks: []budget.TaskBudget{{TaskID: "x", Limit: 100_000}}})
		if err != nil {
			t.Fatal(err)
		}
		beginAttempts(t, b.ledger, ra)
		reserveSettle(t, b, ra, 200)
		held := reserve(t, b, ra, 300)

		ten := b.setBudget(t, budget.TenantBudget{TenantID: "globex", Limit: 500, Period: budget.Period{Kind: budget.PeriodDay}})
		if ten.Reserved != 300 || ten.Spent != 0 || ten.Available() != 200 {
			t.Errorf("tenant account after the budget was set = %+v; want the 300 held by its open run reserved, 200 available", ten)
		}
		run, err := b.ledger.RunAccount(b.ctx, "early")
		if err != nil || run.ParentID != ten.ID {
			t.Errorf("run account %+v, %v; want it under the tenant's account %d", run, err, ten.ID)
		}
		// Granted only what the tenant has left.
		r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["x"], Want: 400, Min: 100, Holder: "n", TTL: ttl}))
		if err != nil || r.Amount != 200 {
			t.Fatalf("reserve of 400 with 200 left in the tenant: %+v, %v; want 200 granted", r, err)
		}
		settle(t, b, r, 200, false)
		settle(t, b, held, 300, false)
		got, err := b.ledger.TenantAccount(b.ctx, "globex")
		if err != nil || got.Spent != 500 || got.PeriodSpent != 500 || got.Reserved != 0 {
			t.Errorf("tenant after = %+v, %v; want 500 spent in this period (the held 300 and the 200 granted after)", got, err)
		}
		if p := b.periodSpend(t, "globex"); len(p) != 1 || p[0] != 500 {
			t.Errorf("tenant_period_spend = %v; want [500]", p)
		}
		if _, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["x"], Want: 10, Min: 10, Holder: "n", TTL: ttl})); !errors.Is(err, budget.ErrExhausted) {
			t.Errorf("reserve after the tenant spent its budget: %v; want ErrExhausted", err)
		}

		// A run opened afterwards without the tenant's account named.
		late, err := b.ledger.OpenRun(b.ctx, budget.OpenRunParams{RunID: "late", TenantID: "globex", Limit: 1000,
			MinReservation: 10, Tasks: []budget.TaskBudget{{TaskID: "x", Limit: 1000}}})
		if err != nil {
			t.Fatal(err)
		}
		if late.Run.ParentID != ten.ID {
			t.Errorf("run opened after the budget was set, without naming the tenant's account: parent %d; want %d", late.Run.ParentID, ten.ID)
		}
		b.checkConserved(t)
	})
	t.Run("exhausted at once", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ra, err := b.ledger.OpenRun(b.ctx, budget.OpenRunParams{RunID: "big", TenantID: "globex", Limit: 100_000,
			MinReservation: 10, Tasks: []budget.TaskBudget{{TaskID: "x", Limit: 100_000}}})
		if err != nil {
			t.Fatal(err)
		}
		beginAttempts(t, b.ledger, ra)
		held := reserve(t, b, ra, 3000)
		ten := b.setBudget(t, budget.TenantBudget{TenantID: "globex", Limit: 500, Period: budget.Period{Kind: budget.PeriodDay}})
		if ten.Reserved != 3000 || ten.Available() != 0 {
			t.Errorf("tenant account = %+v; want the 3000 held reserved and nothing available", ten)
		}
		run, err := b.ledger.RunAccount(b.ctx, "big")
		if err != nil || run.State != budget.StateExhausted || run.Cause != "tenant budget exhausted" {
			t.Errorf("run = %+v, %v; want it exhausted by the tenant's budget", run, err)
		}
		settle(t, b, held, 2500, false)
		got, err := b.ledger.TenantAccount(b.ctx, "globex")
		if err != nil || got.Spent != 2500 || got.PeriodSpent != 2500 {
			t.Errorf("tenant after = %+v, %v; want the 2500 spent of what was held counted", got, err)
		}
		b.checkConserved(t)
	})
	t.Run("a reserve that read its chain before the budget", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ra, err := b.ledger.OpenRun(b.ctx, budget.OpenRunParams{RunID: "racing", TenantID: "globex", Limit: 100_000,
			MinReservation: 10, Tasks: []budget.TaskBudget{{TaskID: "x", Limit: 100_000}}})
		if err != nil {
			t.Fatal(err)
		}
		beginAttempts(t, b.ledger, ra)
		// The budget's transaction holds the run's accounts, uncommitted.
		tx, err := b.pool.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background()) //nolint:errcheck // committed below; a rollback after it is a no-op
		if _, err := tx.Exec(b.ctx, `SELECT * FROM fanout.ledger_set_tenant_budget($1, 'globex', 100, 'day', NULL)`, storetest.Actor(t, b.pool)); err != nil {
			t.Fatal(err)
		}
		type result struct {
			r   budget.Reservation
			err error
		}
		got := make(chan result, 1)
		go func() {
			r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["x"], Want: 500, Min: 10, Holder: "n", TTL: ttl}))
			got <- result{r, err}
		}()
		// The reserve has read the task's chain and waits for its lock.
		b.awaitLockWait(t, func() bool { return false }, "the reserve did not wait for the budget's locks")
		if err := tx.Commit(b.ctx); err != nil {
			t.Fatal(err)
		}
		var res result
		select {
		case res = <-got:
		case <-time.After(patience):
			t.Fatalf("the reserve did not end within %v of the budget's commit", patience)
		}
		if res.err != nil || res.r.Amount != 100 {
			t.Errorf("reserve of 500 after a budget of 100 committed: %+v, %v; want the tenant's 100 granted", res.r, res.err)
		}
		ten, err := b.ledger.TenantAccount(b.ctx, "globex")
		if err != nil || ten.Reserved != res.r.Amount {
			t.Errorf("tenant account %+v, %v; want the grant (%d) reserved on it", ten, err, res.r.Amount)
		}
		b.checkConserved(t)
	})
	t.Run("a run opened while the first budget is set", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// The tenant exists already (a run of it was opened before): a
		// first open would make the budget wait on the tenant row's insert.
		if _, err := b.ledger.OpenRun(b.ctx, budget.OpenRunParams{RunID: "earlier", TenantID: "globex", Limit: 1000,
			MinReservation: 10, Tasks: []budget.TaskBudget{{TaskID: "x", Limit: 1000}}}); err != nil {
			t.Fatal(err)
		}
		// The run's open is left uncommitted while the budget is set.
		tx, err := b.pool.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background()) //nolint:errcheck // committed below; a rollback after it is a no-op
		if _, err := tx.Exec(b.ctx, `SELECT * FROM fanout.ledger_open_run('racing', 'globex', NULL, 1000, 10, ARRAY['x'], ARRAY[1000::bigint])`); err != nil {
			t.Fatal(err)
		}
		set := make(chan error, 1)
		go func() {
			_, err := b.ledger.SetTenantBudget(b.ctx, budget.TenantBudget{TenantID: "globex", Limit: 500,
				Period: budget.Period{Kind: budget.PeriodDay}, Actor: storetest.Actor(t, b.pool)})
			set <- err
		}()
		// Either the budget waits for the run's open, or it committed first.
		b.awaitLockWait(t, func() bool { return len(set) > 0 }, "the budget neither committed nor waited")
		if err := tx.Commit(b.ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-set:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(patience):
			t.Fatalf("the budget was not set within %v of the run's open", patience)
		}
		ten, err := b.ledger.TenantAccount(b.ctx, "globex")
		if err != nil {
			t.Fatal(err)
		}
		run, err := b.ledger.RunAccount(b.ctx, "racing")
		if err != nil || run.ParentID != ten.ID {
			t.Errorf("run opened while the tenant's first budget was set: %+v, %v; want it under the tenant's account %d", run, err, ten.ID)
		}
		b.checkConserved(t)
	})
	t.Run("what was raised to cover is given back as it resolves", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ra, err := b.ledger.OpenRun(b.ctx, budget.OpenRunParams{RunID: "held", TenantID: "globex", Limit: 100_000,
			MinReservation: 10, Tasks: []budget.TaskBudget{{TaskID: "x", Limit: 100_000}}})
		if err != nil {
			t.Fatal(err)
		}
		beginAttempts(t, b.ledger, ra)
		held := reserve(t, b, ra, 3000)
		voided := reserve(t, b, ra, 1000)
		ten := b.setBudget(t, budget.TenantBudget{TenantID: "globex", Limit: 500, Period: budget.Period{Kind: budget.PeriodDay}})
		if ten.Limit != 4000 || ten.Available() != 0 {
			t.Fatalf("tenant = %+v; want its limit raised to the 4000 held, nothing available", ten)
		}
		settle(t, b, held, 100, false)
		// Given back as far as the 1000 still held allows.
		if got, err := b.ledger.TenantAccount(b.ctx, "globex"); err != nil || got.Limit != 1100 || got.Available() != 0 {
			t.Errorf("tenant after the settle = %+v, %v; want its limit down to spent 100 + held 1000 = 1100, nothing available", got, err)
		}
		if _, err := b.ledger.Void(b.ctx, voided.ID, voided.Lease.Generation, ""); err != nil {
			t.Fatal(err)
		}
		got, err := b.ledger.TenantAccount(b.ctx, "globex")
		if err != nil || got.Limit != 500 || got.Spent != 100 || got.Available() != 400 {
			t.Errorf("tenant after what it held resolved = %+v, %v; want the limit back at the budget, 500: 100 spent, 400 left", got, err)
		}
		// A run opened now is granted what the budget leaves, not what was held.
		late, err := b.ledger.OpenRun(b.ctx, budget.OpenRunParams{RunID: "late", TenantID: "globex", Limit: 100_000,
			MinReservation: 10, Tasks: []budget.TaskBudget{{TaskID: "x", Limit: 100_000}}})
		if err != nil {
			t.Fatal(err)
		}
		beginAttempts(t, b.ledger, late)
		r, err := b.ledger.Reserve(b.ctx, grant(late, budget.ReserveParams{Account: late.Tasks["x"], Want: 2900, Min: 10, Holder: "n", TTL: ttl}))
		if err != nil || r.Amount != 400 {
			t.Errorf("reserve of 2900 after the budget's 400 were left: %+v, %v; want 400", r, err)
		}
		b.checkConserved(t)
	})
}

// awaitLockWait polls the server until a session of the test's database
// waits for a lock, or done reports true; after patience it fails t with
// what, naming the wait.
func (b *testBundle) awaitLockWait(t *testing.T, done func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(patience); !done(); time.Sleep(10 * time.Millisecond) { // polling the server
		var waiting int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s within %v", what, patience)
		}
	}
}
