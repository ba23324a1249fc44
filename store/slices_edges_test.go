package store_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
)

// The edges of the slice protocol (docs/ledger.md#budget-slices), one test
// each. Slices are carved at begin in beginAttempts's (map) order, so a
// test that needs which task got what sorts the figures.

func (b *testBundle) taskLimits(t *testing.T, ra budget.RunAccounts) []int64 {
	t.Helper()
	var got []int64
	for _, id := range ra.Tasks {
		got = append(got, b.account(t, id).Limit)
	}
	slices.Sort(got)
	return got
}

// TestSliceNeverPastItsParent: a carve is bounded by what the run, and the
// tenant, have available; a pool with less than a slice size gives what it
// has, then nothing.
func TestSliceNeverPastItsParent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openSliced(t, "r1", 0, 1_000, 10, 1_000, 400, 4)
	if got := b.taskLimits(t, ra); !slices.Equal(got, []int64{0, 200, 400, 400}) {
		t.Errorf("slices of 400 from a run of 1,000: %v, want [0 200 400 400]", got)
	}
	if run := b.account(t, ra.Run.ID); run.Reserved != 1_000 {
		t.Errorf("run reserved %d, want its whole 1,000 carved", run.Reserved)
	}
	ten := b.openTenant(t, 700)
	rt := b.openSliced(t, "r2", ten.ID, 10_000, 10, 1_000, 400, 3)
	if got := b.taskLimits(t, rt); !slices.Equal(got, []int64{0, 300, 400}) {
		t.Errorf("slices of 400 under a tenant of 700: %v, want [0 300 400]", got)
	}
	if tn := b.account(t, ten.ID); tn.Reserved != 700 {
		t.Errorf("tenant reserved %d, want its whole 700 carved", tn.Reserved)
	}
	b.checkConserved(t)
}

// TestSliceCallAfterCancelIsRefused: a cancel marks the run's slices; a
// call on a slice that has tokens on its row (a reservation held at the
// cancel, voided after) is refused naming the run.
func TestSliceCallAfterCancelIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openSliced(t, "r1", 0, 10_000, 10, 5_000, 1_000, 2)
	t0 := ra.Tasks["t0"]
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: t0, Want: 300, Min: 300, Holder: "w", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.CancelRun(b.ctx, "r1", "test"); err != nil {
		t.Fatal(err)
	}
	if a := b.account(t, t0); a.State != budget.StateCancelled {
		t.Errorf("sliced task after its run's cancel: %s, want cancelled (the mark)", a.State)
	}
	if _, err := b.ledger.Void(b.ctx, r.ID, r.Lease.Generation, ""); err != nil {
		t.Fatal(err)
	}
	if a := b.account(t, t0); a.Limit-a.Reserved-a.Spent != 300 {
		t.Fatalf("slice after the void: %+v, want 300 on its row", a)
	}
	_, err = b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: t0, Want: 100, Min: 1, Holder: "w", TTL: ttl}))
	var ex *budget.ExhaustedError
	if !errors.As(err, &ex) || ex.Kind != budget.KindRun || ex.State != budget.StateCancelled {
		t.Errorf("reserve on a slice of a cancelled run: %v, want refused naming the cancelled run", err)
	}
	b.checkConserved(t)
}

// TestSliceRecallThenDrain: a top-up that the pool cannot pay recalls the
// unused part of a sibling's slice (not what the sibling's held call
// holds); a pool left below the minimum exhausts the run and marks its
// slices; under DRAIN the sibling's retry with its key replays its grant,
// and a new call on it is refused.
func TestSliceRecallThenDrain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openSliced(t, "r1", 0, 1_000, 150, 1_000, 300, 2)
	t0, t1 := ra.Tasks["t0"], ra.Tasks["t1"]
	p0 := grant(ra, budget.ReserveParams{Account: t0, Want: 100, Min: 100, Holder: "w", TTL: ttl, Key: "k0"})
	r0, err := b.ledger.Reserve(b.ctx, p0)
	if err != nil {
		t.Fatal(err)
	}
	// t1 wants 800: its 300, the pool's 400, and 100 of t0's 200 unused.
	r1, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: t1, Want: 800, Min: 800, Holder: "w", TTL: ttl}))
	if err != nil || r1.Amount != 800 {
		t.Fatalf("reserve of 800 with a recall: %+v, %v", r1, err)
	}
	if a := b.account(t, t0); a.Limit != 100 || a.Reserved != 100 {
		t.Errorf("sibling after the recall: limit %d reserved %d, want 100/100 (its held call stays carved)", a.Limit, a.Reserved)
	}
	run := b.account(t, ra.Run.ID)
	if run.State != budget.StateExhausted || run.Reserved != 900 {
		t.Errorf("run after the top-up: %+v, want exhausted (100 left < 150) and 900 reserved", run)
	}
	if a := b.account(t, t0); a.State != budget.StateExhausted {
		t.Errorf("sibling slice %s, want exhausted (the mark)", a.State)
	}
	again, err := b.ledger.Reserve(b.ctx, p0)
	if err != nil || again.ID != r0.ID || again.Amount != 100 {
		t.Errorf("retry with the held key under DRAIN: %+v, %v, want reservation %d replayed", again, err, r0.ID)
	}
	if _, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: t0, Want: 10, Min: 1, Holder: "w", TTL: ttl, Key: "k1"})); !errors.Is(err, budget.ErrExhausted) {
		t.Errorf("a new call on a slice of an exhausted run: %v, want ErrExhausted", err)
	}
	b.checkConserved(t)
}

// TestSliceRecalledSiblingTopsUp: after a recall took a sibling's unused
// tokens, the sibling's next call tops its slice up by its slice size.
func TestSliceRecalledSiblingTopsUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openSliced(t, "r1", 0, 3_000, 10, 3_000, 300, 2)
	t0, t1 := ra.Tasks["t0"], ra.Tasks["t1"]
	reserve := func(task budget.AccountID, n int64) budget.Reservation {
		t.Helper()
		r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: task, Want: n, Min: n, Holder: "w", TTL: ttl}))
		if err != nil {
			t.Fatalf("reserve %d: %v", n, err)
		}
		return r
	}
	// t0's slice grows to 1,300 (a top-up), and 1,200 of it is unused.
	r := reserve(t0, 1_300)
	if _, err := b.ledger.Void(b.ctx, r.ID, r.Lease.Generation, ""); err != nil {
		t.Fatal(err)
	}
	reserve(t0, 100)
	// t1 wants 1,900: its 300, the pool's 1,400, and 200 of t0's.
	reserve(t1, 1_900)
	if a := b.account(t, t0); a.Limit != 100 {
		t.Fatalf("sibling after the recall: limit %d, want 100 (what its call holds)", a.Limit)
	}
	reserve(t0, 50)
	if a := b.account(t, t0); a.Limit != 400 {
		t.Errorf("sibling topped up to %d, want 100 + its slice size 300", a.Limit)
	}
	if run := b.account(t, ra.Run.ID); run.State != budget.StateOpen || run.Reserved != 2_300 {
		t.Errorf("run %+v, want open with 2,300 carved", run)
	}
	b.checkConserved(t)
}

// TestSliceRecallWaitsForTheHolder: a recall locks the sibling's row, so a
// call under way on the sibling's slice (its transaction holding that row)
// commits first, and the recall takes only what that call left.
func TestSliceRecallWaitsForTheHolder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openSliced(t, "r1", 0, 2_000, 10, 2_000, 800, 2)
	t0, t1 := ra.Tasks["t0"], ra.Tasks["t1"]
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	var outcome string
	if err := tx.QueryRow(b.ctx, `SELECT (ledger_reserve($1, 'r1', 'tenant-a', 1, 300, 300, 'holder', interval '1 minute', NULL)).outcome`,
		int64(t0)).Scan(&outcome); err != nil || outcome != "ok" {
		t.Fatalf("the holder's call on its slice: %s, %v", outcome, err)
	}
	done := make(chan error, 1)
	var r budget.Reservation
	go func() {
		var err error
		r, err = b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: t1, Want: 1_500, Min: 1_500, Holder: "w", TTL: ttl}))
		done <- err
	}()
	if err := b.awaitLockWaitOr(t, done); err != nil {
		t.Fatalf("the top-up that recalls finished while the sibling's call was under way: %v", err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil || r.Amount != 1_500 {
			t.Fatalf("top-up after the holder committed: %+v, %v", r, err)
		}
	case <-time.After(patience):
		t.Fatal("the top-up did not finish after the holder committed")
	}
	if a := b.account(t, t0); a.Limit != 300 || a.Reserved != 300 {
		t.Errorf("sibling after the recall: limit %d reserved %d, want 300/300 (what its call holds)", a.Limit, a.Reserved)
	}
	b.checkConserved(t)
}

// awaitLockWaitOr polls until a backend of the test's database waits on a
// lock; it returns done's value if done is sent first (nil when it was
// sent nil: the call did not wait).
func (b *testBundle) awaitLockWaitOr(t *testing.T, done chan error) error {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		select {
		case err := <-done:
			if err == nil {
				err = errors.New("it did not wait")
			}
			return err
		default:
		}
		var n int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			t.Fatalf("no call waited on a lock within %v", patience)
		}
		time.Sleep(20 * time.Millisecond) // polling pg_stat_activity
	}
}

// TestSliceHotPathTouchesNoSharedRow: with the run's row locked by another
// transaction, a reserve and a settle that the slice pays for complete; a
// reserve that needs a top-up waits for that lock.
func TestSliceHotPathTouchesNoSharedRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ten := b.openTenant(t, 100_000)
	ra := b.openSliced(t, "r1", ten.ID, 10_000, 10, 5_000, 1_000, 2)
	t0 := ra.Tasks["t0"]
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	if _, err := tx.Exec(b.ctx, `SELECT FROM account WHERE account_id = $1 FOR UPDATE`, int64(ra.Run.ID)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	r, err := b.ledger.Reserve(ctx, grant(ra, budget.ReserveParams{Account: t0, Want: 600, Min: 600, Holder: "w", TTL: ttl}))
	if err != nil {
		t.Fatalf("reserve on the slice with the run's row locked: %v", err)
	}
	if _, err := b.ledger.Settle(ctx, budget.SettleParams{Reservation: r.ID, Generation: r.Lease.Generation, Actual: 500}); err != nil {
		t.Fatalf("settle on the slice with the run's row locked: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: t0, Want: 900, Min: 900, Holder: "w", TTL: ttl}))
		done <- err
	}()
	if err := b.awaitLockWaitOr(t, done); err != nil {
		t.Fatalf("a top-up finished with the run's row locked: %v", err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("top-up after the lock was released: %v", err)
		}
	case <-time.After(patience):
		t.Fatal("the top-up did not finish after the run's row was released")
	}
	b.checkConserved(t)
}

// TestSliceExpiredIsSpentAndPosted: an expired reservation on a slice is
// spent on the slice, whole, not refunded; the close posts it to the run
// and the tenant.
func TestSliceExpiredIsSpentAndPosted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ten := b.openTenant(t, 100_000)
	ra := b.openSliced(t, "r1", ten.ID, 10_000, 10, 5_000, 1_000, 2)
	t0 := ra.Tasks["t0"]
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: t0, Want: 300, Min: 300, Holder: "w", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, "UPDATE reservation SET lease_expires_at = now() - interval '1 second' WHERE reservation_id = $1", int64(r.ID)); err != nil {
		t.Fatal(err)
	}
	if n, err := b.ledger.ExpireLeases(b.ctx); err != nil || n != 1 {
		t.Fatalf("ExpireLeases = %d, %v", n, err)
	}
	if a := b.account(t, t0); a.Spent != 300 || a.Reserved != 0 || a.Limit != 1_000 {
		t.Errorf("slice after its call expired: %+v, want 300 spent, 0 reserved, still 1,000 carved", a)
	}
	if _, err := b.ledger.CloseRun(b.ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if run := b.account(t, ra.Run.ID); run.Spent != 300 || run.Reserved != 0 || run.State != budget.StateClosed {
		t.Errorf("run after the close: %+v, want closed with the expired 300 posted", run)
	}
	if tn := b.account(t, ten.ID); tn.Spent != 300 || tn.Reserved != 0 {
		t.Errorf("tenant after the close: spent %d reserved %d, want 300 and 0", tn.Spent, tn.Reserved)
	}
	b.checkConserved(t)
}

// TestSliceTopUpMovesTheTenant: a carve, at begin and at a top-up, counts
// on the tenant's reserved as on the run's.
func TestSliceTopUpMovesTheTenant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ten := b.openTenant(t, 100_000)
	ra := b.openSliced(t, "r1", ten.ID, 10_000, 10, 5_000, 1_000, 2)
	if tn, run := b.account(t, ten.ID), b.account(t, ra.Run.ID); tn.Reserved != 2_000 || run.Reserved != 2_000 {
		t.Errorf("after two slices of 1,000: tenant reserved %d, run %d, want 2,000 each", tn.Reserved, run.Reserved)
	}
	if _, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 1_500, Min: 1_500, Holder: "w", TTL: ttl})); err != nil {
		t.Fatal(err)
	}
	if tn, run := b.account(t, ten.ID), b.account(t, ra.Run.ID); tn.Reserved != 3_000 || run.Reserved != 3_000 {
		t.Errorf("after a top-up of 1,000: tenant reserved %d, run %d, want 3,000 each", tn.Reserved, run.Reserved)
	}
	b.checkConserved(t)
}

// TestSliceReturnPostsSpend: a task's end returns what its slice did not
// use and posts what it spent, to the run and the tenant.
func TestSliceReturnPostsSpend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ten := b.openTenant(t, 100_000)
	ra := b.openSliced(t, "r1", ten.ID, 10_000, 10, 5_000, 1_000, 2)
	t0 := ra.Tasks["t0"]
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: t0, Want: 400, Min: 400, Holder: "w", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r.ID, Generation: r.Lease.Generation, Actual: 300}); err != nil {
		t.Fatal(err)
	}
	var back int64
	if err := b.pool.QueryRow(b.ctx, `SELECT ledger_return_slices('r1', ARRAY['t0'])`).Scan(&back); err != nil || back != 700 {
		t.Fatalf("return of t0's slice: %d back, %v; want 700", back, err)
	}
	if a := b.account(t, t0); a.Limit != 300 || a.Spent != 300 {
		t.Errorf("returned slice: %+v, want limit 300 = spent", a)
	}
	for _, id := range []budget.AccountID{ten.ID, ra.Run.ID} {
		if a := b.account(t, id); a.Spent != 300 || a.Reserved != 1_000 {
			t.Errorf("%s after the return: spent %d reserved %d, want 300 posted and t1's 1,000 carved", a.Kind, a.Spent, a.Reserved)
		}
	}
	b.checkConserved(t)
}

// TestSliceAdoptedByATenantBudget: a tenant budget set mid-run counts the
// run's slices as reserved on the tenant (what they have not posted, spent
// or not), and the close posts them there.
func TestSliceAdoptedByATenantBudget(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := budget.OpenRunParams{RunID: "early", TenantID: "globex", Limit: 10_000, MinReservation: 10,
		Tasks: []budget.TaskBudget{{TaskID: "t0", Limit: 5_000, Slice: 1_000}, {TaskID: "t1", Limit: 5_000, Slice: 500}}}
	ra, err := b.ledger.OpenRun(b.ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	beginAttempts(t, b.ledger, ra)
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 400, Min: 400, Holder: "w", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r.ID, Generation: r.Lease.Generation, Actual: 200}); err != nil {
		t.Fatal(err)
	}
	ten := b.setBudget(t, budget.TenantBudget{TenantID: "globex", Limit: 5_000, Period: budget.Period{Kind: budget.PeriodDay}})
	if row := b.account(t, ten.ID); row.Reserved != 1_500 || row.Spent != 0 {
		t.Errorf("tenant's row after adopting the run: reserved %d spent %d, want its slices' 1,500 reserved", row.Reserved, row.Spent)
	}
	// tenant_budget counts what the slices spent and did not post as spent.
	if ten.Reserved != 1_300 || ten.Spent != 200 {
		t.Errorf("tenant budget after adopting the run: reserved %d spent %d, want 1,300 and the slice's 200 spent", ten.Reserved, ten.Spent)
	}
	b.checkConserved(t)
	if _, err := b.ledger.CloseRun(b.ctx, "early"); err != nil {
		t.Fatal(err)
	}
	got, err := b.ledger.TenantAccount(b.ctx, "globex")
	if err != nil || got.Reserved != 0 || got.Spent != 200 {
		t.Errorf("tenant after the close: %+v, %v; want 200 spent, nothing reserved", got, err)
	}
	b.checkConserved(t)
}

// TestSliceNeverOutlivesItsPeriod: what a slice spent before its tenant's
// period ended counts in that period, what it spends after in the next; a
// settle after the end on a slice carved before it takes the chain's locks
// and rolls the period over first.
func TestSliceNeverOutlivesItsPeriod(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ten := b.setBudget(t, budget.TenantBudget{TenantID: "acme", Limit: 10_000,
		Period: budget.Period{Kind: budget.PeriodEvery, Every: 3 * time.Second}})
	ra, err := b.ledger.OpenRun(b.ctx, budget.OpenRunParams{RunID: "r1", TenantID: "acme", TenantAccount: ten.ID, Limit: 100_000,
		MinReservation: 10, Tasks: []budget.TaskBudget{{TaskID: "t0", Limit: 5_000, Slice: 1_000}}})
	if err != nil {
		t.Fatal(err)
	}
	beginAttempts(t, b.ledger, ra)
	t0 := ra.Tasks["t0"]
	r1, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: t0, Want: 200, Min: 200, Holder: "w", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r1.ID, Generation: r1.Lease.Generation, Actual: 200}); err != nil {
		t.Fatal(err)
	}
	r2, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: t0, Want: 300, Min: 300, Holder: "w", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	if b.periodEnded(t, ten) {
		t.Fatal("the period ended before the first part of the test was done: the machine is too slow for this test's period")
	}
	b.waitPeriodEnd(t, ten)
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r2.ID, Generation: r2.Lease.Generation, Actual: 100}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.CloseRun(b.ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if p := b.periodSpend(t, "acme"); len(p) != 2 || p[0] != 200 || p[1] != 100 {
		t.Errorf("tenant_period_spend = %v; want [200 100]: the slice's 200 before the end, its 100 after", p)
	}
	got, err := b.ledger.TenantAccount(b.ctx, "acme")
	if err != nil || got.PeriodSpent != 100 || got.Reserved != 0 {
		t.Errorf("tenant after the close: %+v, %v; want 100 spent in this period, nothing reserved", got, err)
	}
	b.checkConserved(t)
}
