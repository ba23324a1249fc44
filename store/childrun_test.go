package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// Child runs (docs/ledger.md#child-runs): a run carved from one task of
// another, at any depth, in one ledger.

// openChild opens child run id under task of ra (attempt 1) asking for
// want tokens, with tasks c0, c1, ... of cap taskLimit (sliced by slice when
// > 0), and begins their first attempts.
func (b *testBundle) openChild(t *testing.T, ra budget.RunAccounts, task, id string, want, taskLimit, slice int64, n int) (budget.Reservation, budget.RunAccounts) {
	t.Helper()
	p := budget.OpenChildRunParams{RunID: id, TenantID: ra.Run.TenantID, ParentTask: ra.Tasks[task], Attempt: 1,
		Want: want, Min: 10, TTL: time.Minute}
	for i := range n {
		p.Tasks = append(p.Tasks, budget.TaskBudget{TaskID: fmt.Sprintf("c%d", i), Limit: taskLimit, Slice: slice})
	}
	f, ca, err := b.ledger.OpenChildRun(b.ctx, p)
	if err != nil {
		t.Fatalf("open child run %s under %s/%s: %v", id, ra.Run.RunID, task, err)
	}
	beginAttempts(t, b.ledger, ca)
	return f, ca
}

// spend reserves and settles n tokens on task of ra.
func (b *testBundle) spend(t *testing.T, ra budget.RunAccounts, task string, n int64) {
	t.Helper()
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks[task], Want: n, Min: n, Holder: "w",
		TTL: time.Minute}))
	if err != nil {
		t.Fatalf("reserve %d on %s/%s: %v", n, ra.Run.RunID, task, err)
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r.ID, Generation: r.Lease.Generation, Actual: n}); err != nil {
		t.Fatal(err)
	}
}

// closeChild closes child run id and posts its spend on its parent task.
func (b *testBundle) closeChild(t *testing.T, id string) budget.Reservation {
	t.Helper()
	if _, err := b.ledger.CloseRun(b.ctx, id); err != nil {
		t.Fatal(err)
	}
	f, err := b.ledger.SettleFunding(b.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestChildSpendRollsUp: a three-level tree (root -> child -> grandchild,
// sliced and not) spends at every level; each child's close posts its
// spend, its own children's included, on its parent task, so the root's
// spent is every level's, and every account is conserved at every step.
func TestChildSpendRollsUp(t *testing.T) {
	b := setup(t)
	ten := b.openTenant(t, 100_000)
	root := b.openSliced(t, "root", ten.ID, 20_000, 100, 10_000, 1_000, 2)
	f1, child := b.openChild(t, root, "t0", "child", 6_000, 3_000, 500, 2)
	f2, grand := b.openChild(t, child, "c0", "grand", 2_000, 2_000, 0, 2)
	if f1.Amount != 6_000 || f2.Amount != 2_000 || child.Run.Limit != 6_000 || grand.Run.Limit != 2_000 {
		t.Fatalf("funding %d and %d, limits %d and %d: want each child's limit its grant", f1.Amount, f2.Amount,
			child.Run.Limit, grand.Run.Limit)
	}
	b.checkConserved(t)
	b.spend(t, grand, "c0", 500)
	b.spend(t, grand, "c1", 200)
	b.spend(t, child, "c1", 300)
	b.spend(t, root, "t1", 1_000)
	b.checkConserved(t)
	want := map[string]treeSpend{
		"root":  {root: "root", depth: 0, own: 1_000, tree: 2_000},
		"child": {root: "root", parent: "root", task: "t0", depth: 1, own: 300, tree: 1_000},
		"grand": {root: "root", parent: "child", task: "c0", depth: 2, own: 700, tree: 700},
	}
	b.checkTreeSpend(t, "every level in flight", want)
	if got := b.closeChild(t, "grand"); got.Actual != 700 || got.State != budget.ReservationSettled {
		t.Fatalf("the grandchild's funding settled %+v, want actual 700", got)
	}
	if got := b.account(t, child.Tasks["c0"]); got.Spent != 700 {
		t.Fatalf("the child's task c0 spent %d after its child closed, want its child's 700", got.Spent)
	}
	b.checkConserved(t)
	b.checkTreeSpend(t, "the grandchild closed", want)
	if got := b.closeChild(t, "child"); got.Actual != 1_000 {
		t.Fatalf("the child's funding settled at %d, want its own 300 and its child's 700", got.Actual)
	}
	again, err := b.ledger.SettleFunding(b.ctx, "child")
	if err != nil || again.Actual != 1_000 {
		t.Fatalf("settle the funding again: %+v, %v (want the first settle's replay)", again, err)
	}
	if _, err := b.ledger.CloseRun(b.ctx, "root"); err != nil {
		t.Fatal(err)
	}
	if got := b.account(t, root.Run.ID); got.Spent != 2_000 || got.Reserved != 0 {
		t.Fatalf("root spent %d reserved %d, want 2,000 (500 + 200 + 300 + 1,000) and 0", got.Spent, got.Reserved)
	}
	if got := b.account(t, ten.ID); got.Spent != 2_000 || got.Reserved != 0 {
		t.Fatalf("tenant spent %d reserved %d, want 2,000 and 0", got.Spent, got.Reserved)
	}
	b.checkTreeSpend(t, "every level closed", want)
	b.checkConserved(t)
}

// treeSpend is a row of the view run_tree_spend.
type treeSpend struct {
	root, parent, task string
	depth              int
	own, tree          int64
}

// checkTreeSpend compares run_tree_spend with want, by run.
func (b *testBundle) checkTreeSpend(t *testing.T, when string, want map[string]treeSpend) {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT run_id, root_run_id, coalesce(parent_run_id, ''), coalesce(parent_task_id, ''),
		depth, own_spent_tokens, tree_spent_tokens FROM run_tree_spend`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]treeSpend{}
	for rows.Next() {
		var id string
		var r treeSpend
		if err := rows.Scan(&id, &r.root, &r.parent, &r.task, &r.depth, &r.own, &r.tree); err != nil {
			t.Fatal(err)
		}
		got[id] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s: run_tree_spend of %s is %+v, want %+v", when, id, got[id], w)
		}
	}
}

// TestChildIsCarvedFromWhatItsParentHasLeft: a child gets at most what
// every account above it has available — here its parent task's cap less
// what the task holds — and a parent that cannot grant the child's minimum
// opens nothing. Settling a child that has not closed is refused.
func TestChildIsCarvedFromWhatItsParentHasLeft(t *testing.T) {
	b := setup(t)
	root := b.openRun(t, "root", 10_000, 10, 3_000, 3_000)
	held, err := b.ledger.Reserve(b.ctx, grant(root, budget.ReserveParams{Account: root.Tasks["t0"], Want: 1_000, Min: 1,
		Holder: "w", TTL: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	f, child := b.openChild(t, root, "t0", "child", 5_000, 5_000, 0, 1)
	if f.Amount != 2_000 || child.Run.Limit != 2_000 {
		t.Fatalf("a child asking 5,000 of a task with 2,000 left got %d (limit %d), want 2,000", f.Amount, child.Run.Limit)
	}
	if got := b.account(t, root.Tasks["t0"]); got.Reserved != 3_000 || ledgerAvailable(got) != 0 {
		t.Fatalf("parent task after the carve: reserved %d available %d, want 3,000 and 0", got.Reserved, ledgerAvailable(got))
	}
	_, _, err = b.ledger.OpenChildRun(b.ctx, budget.OpenChildRunParams{RunID: "second", TenantID: "tenant-a",
		ParentTask: root.Tasks["t0"], Attempt: 1, Want: 500, Min: 10, TTL: time.Minute,
		Tasks: []budget.TaskBudget{{TaskID: "c0", Limit: 500}}})
	var ex *budget.ExhaustedError
	if !errors.As(err, &ex) || ex.Account != root.Tasks["t0"] {
		t.Fatalf("a second child of a task with nothing left: %v, want exhausted naming the task", err)
	}
	if _, err := b.ledger.RunAccount(b.ctx, "second"); !errors.Is(err, budget.ErrNotFound) {
		t.Fatalf("the refused child's account: %v, want none", err)
	}
	if _, err := b.ledger.SettleFunding(b.ctx, "child"); !errors.Is(err, budget.ErrConflict) {
		t.Fatalf("settle the funding of an open child: %v, want a conflict", err)
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: held.ID, Generation: held.Lease.Generation, Actual: 1_000}); err != nil {
		t.Fatal(err)
	}
	b.checkConserved(t)
}

func ledgerAvailable(a budget.Account) int64 { return a.Limit - a.Reserved - a.Spent - a.Held }

// TestWorkerCannotResolveAFunding: the funding reservation answers to no
// attempt's secret, so a worker's login holding the parent task's secret
// can neither settle it low (hiding the child's spend from every account
// above) nor void it (giving back what the child may still spend).
func TestWorkerCannotResolveAFunding(t *testing.T) {
	b := setup(t)
	root := b.openRun(t, "root", 10_000, 10, 5_000)
	a, worker := b.secondAttempt(t, root)
	f, _, err := b.ledger.OpenChildRun(b.ctx, budget.OpenChildRunParams{RunID: "child", TenantID: "tenant-a",
		ParentTask: root.Tasks["t0"], Attempt: a.N, Want: 1_000, Min: 10, TTL: time.Minute,
		Tasks: []budget.TaskBudget{{TaskID: "c0", Limit: 1_000}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := worker.Settle(b.ctx, budget.SettleParams{Reservation: f.ID, Generation: f.Lease.Generation, Actual: 0,
		Secret: a.Secret}); !errors.Is(err, budget.ErrDenied) {
		t.Errorf("a worker settles the funding at 0: %v, want denied", err)
	}
	if _, err := worker.Void(b.ctx, f.ID, f.Lease.Generation, a.Secret); !errors.Is(err, budget.ErrDenied) {
		t.Errorf("a worker voids the funding: %v, want denied", err)
	}
	if got := b.account(t, root.Tasks["t0"]); got.Reserved != 1_000 {
		t.Errorf("parent task reserved %d, want the funding's 1,000 still held", got.Reserved)
	}
	b.checkConserved(t)
}

// TestAncestorEndStopsEveryLevel: the commit that exhausts or cancels a
// run marks every run below it, at every depth, with their slices: no
// grant at any level after it. A cancel after an exhaustion goes down too.
func TestAncestorEndStopsEveryLevel(t *testing.T) {
	for _, how := range []string{"cancel", "exhaust"} {
		t.Run(how, func(t *testing.T) {
			b := setup(t)
			root := b.openSliced(t, "root", 0, 10_000, 100, 8_000, 1_000, 2)
			_, child := b.openChild(t, root, "t0", "child", 4_000, 2_000, 500, 2)
			_, grand := b.openChild(t, child, "c0", "grand", 1_000, 1_000, 0, 1)
			_, great := b.openChild(t, grand, "c0", "great", 500, 500, 100, 1)
			want := budget.StateCancelled
			if how == "cancel" {
				if _, err := b.ledger.CancelRun(b.ctx, "root", "user asked"); err != nil {
					t.Fatal(err)
				}
			} else {
				want = budget.StateExhausted
				// t1 takes what the pool has left but the minimum.
				b.spend(t, root, "t1", ledgerAvailable(b.account(t, root.Run.ID))+1_000-50)
			}
			for _, ra := range []budget.RunAccounts{root, child, grand, great} {
				if got := b.account(t, ra.Run.ID); got.State != want {
					t.Errorf("run %s is %s after its root's %s, want %s", ra.Run.RunID, got.State, how, want)
				}
				for task := range ra.Tasks {
					_, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks[task], Want: 10, Min: 1,
						Holder: "w", TTL: time.Minute}))
					if !errors.Is(err, budget.ErrExhausted) {
						t.Errorf("a grant on %s/%s after its root's %s: %v, want exhausted", ra.Run.RunID, task, how, err)
					}
				}
			}
			// Each run below says why, in its own entry and its own notice.
			kind := map[string]string{"cancel": "cancel", "exhaust": "exhaust"}[how]
			for _, ra := range []budget.RunAccounts{child, grand, great} {
				var n int
				var note string
				if err := b.pool.QueryRow(b.ctx, `SELECT count(*), coalesce(max(note), '') FROM ledger_entry
					WHERE account_id = $1 AND kind = $2`, int64(ra.Run.ID), kind).Scan(&n, &note); err != nil {
					t.Fatal(err)
				}
				if n != 1 || !strings.Contains(note, "above it is") {
					t.Errorf("run %s: %d %s entries (note %q), want one naming the run above", ra.Run.RunID, n, kind, note)
				}
			}
			if how == "exhaust" {
				if _, err := b.ledger.CancelRun(b.ctx, "root", "user asked"); err != nil {
					t.Fatal(err)
				}
				for _, ra := range []budget.RunAccounts{child, grand, great} {
					if got := b.account(t, ra.Run.ID); got.State != budget.StateCancelled {
						t.Errorf("run %s is %s after its exhausted root's cancel, want cancelled", ra.Run.RunID, got.State)
					}
				}
			}
			b.checkConserved(t)
		})
	}
}

// TestAChildOfAnEndedRunIsMarked: a child whose own funding grant exhausts
// the run above it is opened marked, and grants nothing; so is a child
// under a run that closed over it once its funding expired.
func TestAChildOfAnEndedRunIsMarked(t *testing.T) {
	t.Run("funding exhausts the run", func(t *testing.T) {
		b := setup(t)
		root := b.openRun(t, "root", 1_000, 100, 1_000)
		_, child, err := b.ledger.OpenChildRun(b.ctx, budget.OpenChildRunParams{RunID: "child", TenantID: "tenant-a",
			ParentTask: root.Tasks["t0"], Attempt: 1, Want: 950, Min: 10, TTL: time.Minute,
			Tasks: []budget.TaskBudget{{TaskID: "c0", Limit: 950}}})
		if err != nil {
			t.Fatal(err)
		}
		if got := b.account(t, root.Run.ID).State; got != budget.StateExhausted {
			t.Fatalf("root is %s after a funding that left it below its minimum, want exhausted", got)
		}
		if got := b.account(t, child.Run.ID).State; got != budget.StateExhausted {
			t.Errorf("the child opened by the grant that exhausted its root is %s, want exhausted", got)
		}
		if _, err := b.ledger.BeginAttempt(b.ctx, child.Tasks["c0"], "child", "tenant-a"); !errors.Is(err, budget.ErrExhausted) {
			t.Errorf("a task of the child of an exhausted root begins: %v, want exhausted", err)
		}
		b.checkConserved(t)
	})
	t.Run("root closes over an expired funding", func(t *testing.T) {
		b := setup(t)
		root := b.openRun(t, "root", 10_000, 10, 5_000)
		f, child, err := b.ledger.OpenChildRun(b.ctx, budget.OpenChildRunParams{RunID: "child", TenantID: "tenant-a",
			ParentTask: root.Tasks["t0"], Attempt: 1, Want: 1_000, Min: 10, TTL: time.Second,
			Tasks: []budget.TaskBudget{{TaskID: "c0", Limit: 1_000}}})
		if err != nil {
			t.Fatal(err)
		}
		beginAttempts(t, b.ledger, child)
		b.waitLeaseEnd(t, f)
		if n, err := b.ledger.ExpireLeases(b.ctx); err != nil || n != 1 {
			t.Fatalf("expire the funding: %d, %v", n, err)
		}
		if _, err := b.ledger.CloseRun(b.ctx, "root"); err != nil {
			t.Fatal(err)
		}
		if got := b.account(t, child.Run.ID).State; got != budget.StateCancelled {
			t.Errorf("the child of a closed root is %s, want cancelled", got)
		}
		if r, err := b.ledger.Reserve(b.ctx, grant(child, budget.ReserveParams{Account: child.Tasks["c0"], Want: 500, Min: 1,
			Holder: "w", TTL: time.Minute})); !errors.Is(err, budget.ErrExhausted) {
			t.Errorf("the child of a closed root: %+v, %v, want exhausted", r, err)
		}
		if got := b.account(t, root.Tasks["t0"]); got.Spent != 1_000 {
			t.Errorf("the parent task spent %d after its child's funding expired, want the whole 1,000", got.Spent)
		}
		b.checkConserved(t)
	})
}

// TestTenantSpendCountsAChildOnce: the tenant's daily spend is what its
// account spent, each child once (through its funding, as the account
// counts it), and money counts each model call once, in its own run.
func TestTenantSpendCountsAChildOnce(t *testing.T) {
	b := setup(t)
	ten := b.openTenant(t, 100_000)
	root := b.openSliced(t, "root", ten.ID, 20_000, 100, 10_000, 1_000, 2)
	_, child := b.openChild(t, root, "t0", "child", 6_000, 3_000, 0, 1)
	_, grand := b.openChild(t, child, "c0", "grand", 1_000, 1_000, 0, 1)
	b.spend(t, grand, "c0", 100)
	b.spend(t, child, "c0", 300)
	b.spend(t, root, "t1", 1_000)
	b.closeChild(t, "grand")
	b.closeChild(t, "child")
	if _, err := b.ledger.CloseRun(b.ctx, "root"); err != nil {
		t.Fatal(err)
	}
	var daily, lines int64
	if err := b.pool.QueryRow(b.ctx, `SELECT sum(spent_tokens) FROM tenant_spend_daily WHERE tenant_id = 'tenant-a'`).Scan(&daily); err != nil {
		t.Fatal(err)
	}
	if acct := b.account(t, ten.ID).Spent; daily != acct || acct != 1_400 {
		t.Errorf("tenant_spend_daily %d, the tenant account %d: want both 1,400", daily, acct)
	}
	if err := b.pool.QueryRow(b.ctx, `SELECT sum(tokens) FROM money_line WHERE tenant_id = 'tenant-a'`).Scan(&lines); err != nil {
		t.Fatal(err)
	}
	if lines != 1_400 {
		t.Errorf("money_line counts %d tokens, want each call once: 1,400", lines)
	}
}

// TestOpeningAChildAndABudgetChangeDoNotDeadlock: opening a child takes
// the tenant's row before any account, the order a budget change takes
// them in: a change holding the row and then taking the tenant's account
// goes through, and the open after it.
func TestOpeningAChildAndABudgetChangeDoNotDeadlock(t *testing.T) {
	b := setup(t)
	ten := b.openTenant(t, 100_000)
	root := b.openSliced(t, "root", ten.ID, 20_000, 100, 10_000, 0, 1)
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx) //nolint:errcheck // the test's own lock holder
	// ledger_set_tenant_budget's first lock: the tenant's row.
	if _, err := tx.Exec(b.ctx, `SELECT FROM tenant WHERE tenant_id = 'tenant-a' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	// The open on a connection of its own, not retried: a deadlock is
	// an error here, whichever side the server aborts.
	opened := make(chan error, 1)
	go func() {
		var outcome string
		err := b.pool.QueryRow(b.ctx, `SELECT outcome FROM ledger_open_child_run('child', 'tenant-a', $1, 1, 1000, 10,
			'1 minute', '{c0}', '{1000}', '{0}')`, int64(root.Tasks["t0"])).Scan(&outcome)
		if err == nil && outcome != "ok" {
			err = fmt.Errorf("outcome %s", outcome)
		}
		opened <- err
	}()
	// The open waits on a lock before the change takes its second one.
	deadline := time.Now().Add(patience)
	for {
		var waiting bool
		if err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND query LIKE '%ledger_open_child_run%')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the open did not wait on the budget change's lock within %v", patience)
		}
		time.Sleep(20 * time.Millisecond) // polling the server's view of its locks
	}
	// Its second: the tenant's account, which the open must not hold.
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	if _, err := tx.Exec(ctx, `SELECT FROM account WHERE tenant_id = 'tenant-a' AND kind = 'tenant' FOR UPDATE`); err != nil {
		t.Fatalf("the budget change, after the open began: %v", err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-opened; err != nil {
		t.Fatalf("the open, after the budget change: %v", err)
	}
}

// TestAWorkerCannotTakeAChildsKey: a worker holding the parent task's
// secret that reserves under the key the child's funding would use does
// not keep the child from opening, nor become its funding.
func TestAWorkerCannotTakeAChildsKey(t *testing.T) {
	b := setup(t)
	root := b.openRun(t, "root", 10_000, 10, 5_000)
	a, worker := b.secondAttempt(t, root)
	squat, err := worker.Reserve(b.ctx, budget.ReserveParams{Account: root.Tasks["t0"], RunID: "root", TenantID: "tenant-a",
		Attempt: a.N, Want: 10, Min: 1, Holder: "child:child", TTL: time.Minute, Key: "child:child", Secret: a.Secret})
	if err != nil {
		t.Fatal(err)
	}
	f, child, err := b.ledger.OpenChildRun(b.ctx, budget.OpenChildRunParams{RunID: "child", TenantID: "tenant-a",
		ParentTask: root.Tasks["t0"], Attempt: a.N, Want: 1_000, Min: 10, TTL: time.Minute,
		Tasks: []budget.TaskBudget{{TaskID: "c0", Limit: 1_000}}})
	if err != nil {
		t.Fatalf("open a child whose key a worker reserved under: %v", err)
	}
	if f.ID == squat.ID || f.Amount != 1_000 || child.Run.Limit != 1_000 {
		t.Errorf("the child's funding %+v (limit %d), the worker's reservation %d: want its own, of 1,000", f, child.Run.Limit, squat.ID)
	}
}

// secondAttempt begins a second attempt of task t0 of ra and returns it with
// a ledger on a worker's login, which holds that attempt's secret as the
// worker it is dispatched to would.
func (b *testBundle) secondAttempt(t *testing.T, ra budget.RunAccounts) (budget.Attempt, *store.Ledger) {
	t.Helper()
	a, err := b.ledger.BeginAttempt(b.ctx, ra.Tasks["t0"], ra.Run.RunID, ra.Run.TenantID)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := store.Open(b.ctx, storetest.WorkerURL(t, b.url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return a, store.NewLedger(pool)
}

// TestTwoOpensOfOneChildOpenItOnce: two nodes opening the same child at
// once (both released together from behind a budget change's lock) get the
// same child and the same funding; the parent task holds one funding.
func TestTwoOpensOfOneChildOpenItOnce(t *testing.T) {
	b := setup(t)
	ten := b.openTenant(t, 100_000)
	root := b.openSliced(t, "root", ten.ID, 20_000, 100, 10_000, 0, 1)
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx) //nolint:errcheck // the test's own lock holder
	if _, err := tx.Exec(b.ctx, `SELECT FROM tenant WHERE tenant_id = 'tenant-a' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	type opened struct {
		f   budget.Reservation
		err error
	}
	results := make(chan opened, 2)
	for range 2 {
		go func() {
			f, _, err := b.ledger.OpenChildRun(b.ctx, budget.OpenChildRunParams{RunID: "child", TenantID: "tenant-a",
				ParentTask: root.Tasks["t0"], Attempt: 1, Want: 1_000, Min: 10, TTL: time.Minute,
				Tasks: []budget.TaskBudget{{TaskID: "c0", Limit: 1_000}}})
			results <- opened{f, err}
		}()
	}
	deadline := time.Now().Add(patience)
	for {
		var waiting int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND query LIKE '%ledger_open_child_run%'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the two opens waited behind the lock within %v", waiting, patience)
		}
		time.Sleep(20 * time.Millisecond) // polling the server's view of its locks
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	first, second := <-results, <-results
	if first.err != nil || second.err != nil || first.f.ID != second.f.ID {
		t.Fatalf("two opens of one child: %+v, %v and %+v, %v; want both the same funding", first.f, first.err, second.f, second.err)
	}
	if got := b.account(t, root.Tasks["t0"]); got.Reserved != 1_000 {
		t.Errorf("the parent task holds %d, want one funding of 1,000", got.Reserved)
	}
	b.checkConserved(t)
}
