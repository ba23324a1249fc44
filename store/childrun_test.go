package store_test

import (
	"errors"
	"fmt"
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
	a, err := b.ledger.BeginAttempt(b.ctx, root.Tasks["t0"], "root", "tenant-a")
	if err != nil {
		t.Fatal(err)
	}
	f, _, err := b.ledger.OpenChildRun(b.ctx, budget.OpenChildRunParams{RunID: "child", TenantID: "tenant-a",
		ParentTask: root.Tasks["t0"], Attempt: a.N, Want: 1_000, Min: 10, TTL: time.Minute,
		Tasks: []budget.TaskBudget{{TaskID: "c0", Limit: 1_000}}})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := store.Open(b.ctx, storetest.WorkerURL(t, b.url))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	worker := store.NewLedger(pool)
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
