package store_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store"
)

// openTreeRoot opens run "root" of tenant "ten" with tasks a and b (50,000
// tokens each of 100,000), and begins their first attempts.
func (b *testBundle) openTreeRoot(t *testing.T, rs *store.Runs) budget.RunAccounts {
	t.Helper()
	open := budget.OpenRunParams{RunID: "root", TenantID: "ten", Limit: 100_000, MinReservation: 10,
		Tasks: []budget.TaskBudget{{TaskID: "a", Limit: 50_000}, {TaskID: "b", Limit: 50_000}}}
	_, ra, _, err := rs.OpenRun(b.ctx, draftRun("root", "ten", "k-root", "a", "b"), "node1", open, nil, nil, []string{"a", "b"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ra
}

// childOf is the run and ledger accounts of child run id of task parent
// of "root", asking want tokens, with one task, in a tree of at most
// maxTree tasks.
func childOf(ra budget.RunAccounts, id, parent string, want int64, maxTree int) (*fanoutv1.Run, budget.OpenRunParams) {
	d := draftRun(id, "ten", "child:"+id, "c1")
	d.Spec.Budget = &fanoutv1.Budget{LimitTokens: want}
	return d, budget.OpenRunParams{RunID: id, TenantID: "ten", Limit: want, MinReservation: 10,
		Tasks: []budget.TaskBudget{{TaskID: "c1", Limit: want}},
		Child: &budget.ChildFunding{ParentTask: ra.Tasks[parent], Attempt: 1, Min: 10, TTL: time.Minute,
			ParentRunID: "root", ParentTaskID: parent, Call: "call-" + id, RootRunID: "root", Depth: 1,
			MaxTreeTasks: maxTree}}
}

// TestTreeTasksCountedUnderTheRootsLock opens eight one-task children of
// a root of two tasks at once, behind a lock of the root's row, under a
// cap of three tasks for the tree: one opens, seven are refused naming
// the field. Counted in the statement that waited for the lock, each saw
// the tree as it was before the others and all eight opened.
func TestTreeTasksCountedUnderTheRootsLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rs := store.NewRuns(b.pool)
	ra := b.openTreeRoot(t, rs)
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	if _, err := tx.Exec(b.ctx, `SELECT FROM run WHERE run_id = 'root' FOR NO KEY UPDATE`); err != nil {
		t.Fatal(err)
	}
	const n = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	created, full := 0, 0
	for i := range n {
		wg.Go(func() {
			d, p := childOf(ra, fmt.Sprintf("child-%d", i), []string{"a", "b"}[i%2], 100, 3)
			_, _, ok, err := rs.OpenRun(b.ctx, d, "node1", p, nil, nil, nil, nil)
			mu.Lock()
			defer mu.Unlock()
			var tf *runs.TreeFullError
			switch {
			case errors.As(err, &tf):
				full++
			case err != nil:
				t.Errorf("open child-%d: %v", i, err)
			case ok:
				created++
			}
		})
	}
	deadline := time.Now().Add(patience)
	for {
		var waiting int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the %d opens waited behind the root's lock within %v", waiting, n, patience)
		}
		time.Sleep(20 * time.Millisecond) // polling the server's view of its locks
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	var tasks int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM task JOIN run USING (run_id)
		WHERE run_id = 'root' OR root_run_id = 'root'`).Scan(&tasks); err != nil {
		t.Fatal(err)
	}
	if created != 1 || full != n-1 || tasks != 3 {
		t.Errorf("max_tree_tasks 3 (the root's 2 + 1): %d children opened, %d refused; the tree has %d tasks", created, full, tasks)
	}
}

// TestAChildsSpecSaysWhatItWasGranted opens a child asking for more than
// its parent task has left: the ledger grants what is left, and the
// child's stored spec (which its driver plans with, and an adopter plans
// again from) says that, not what was asked.
func TestAChildsSpecSaysWhatItWasGranted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rs := store.NewRuns(b.pool)
	ra := b.openTreeRoot(t, rs)
	d, p := childOf(ra, "child", "a", 80_000, 100)
	stored, accounts, created, err := rs.OpenRun(b.ctx, d, "node1", p, nil, nil, nil, nil)
	if err != nil || !created {
		t.Fatalf("open the child: created %v, %v", created, err)
	}
	read, err := rs.ReadRun(b.ctx, "child")
	if err != nil {
		t.Fatal(err)
	}
	for what, got := range map[string]int64{"the account's limit": accounts.Run.Limit,
		"the returned spec's": stored.GetSpec().GetBudget().GetLimitTokens(),
		"the stored spec's":   read.GetSpec().GetBudget().GetLimitTokens()} {
		if got != 50_000 {
			t.Errorf("%s is %d; task a has 50,000 left of the 80,000 asked: want 50,000", what, got)
		}
	}
	if read.GetParentRunId() != "root" || read.GetParentTaskId() != "a" || read.GetRootRunId() != "root" || read.GetDepth() != 1 {
		t.Errorf("the child is of %s/%s, root %s, depth %d", read.GetParentRunId(), read.GetParentTaskId(),
			read.GetRootRunId(), read.GetDepth())
	}
}

// TestAnswerCallAnswersOnlyItsOwnCall: an orchestrator's login may resolve
// any tool call (ledger_secret_ok); AnswerCall answers a fan_out call only
// of the run and task it names, so that a key a worker sends for another
// task's call, or a child's end, reaches no other call. FanOutCall finds
// a call only under its own run, task and tool.
func TestAnswerCallAnswersOnlyItsOwnCall(t *testing.T) {
	t.Parallel()
	f := newApprovalFixture(t, time.Minute)
	if _, err := f.b.pool.Exec(f.b.ctx, `INSERT INTO fanout.run_tool_policy (tenant_id, run_id, tool, approval, approval_timeout_ms)
		VALUES ('acme', 'r1', 'fan_out', false, 0)`); err != nil {
		t.Fatal(err)
	}
	w := f.ts.at(write(fmt.Sprintf("r1/t1/a%d/i1/c0", f.attempt), f.attempt, 1, 0, `{"tasks":["a"]}`))
	w.Server, w.Tool = "", runs.FanOutTool
	if got, err := f.worker.IssueWrite(f.b.ctx, w, f.secret); err != nil || got.State != runs.WriteIssued {
		t.Fatalf("record a fan_out call: %v, %v", got.State, err)
	}
	note := f.ts.at(write(fmt.Sprintf("r1/t1/a%d/i2/c0", f.attempt), f.attempt, 2, 0, `{"text":"x"}`))
	note.Server, note.Tool = "crm", "crm__note"
	if _, err := f.worker.IssueWrite(f.b.ctx, note, f.secret); err != nil {
		t.Fatal(err)
	}
	rs := store.NewRuns(f.b.pool)
	for _, c := range []struct{ run, task, key string }{{"g1", "t1", w.Key}, {"r1", "t2", w.Key}, {"r1", "t1", note.Key}} {
		if found, _, err := rs.FanOutCall(f.b.ctx, c.run, c.task, c.key); err != nil || found {
			t.Errorf("FanOutCall(%s, %s, %s): found %v, %v; want not found", c.run, c.task, c.key, found, err)
		}
		if err := rs.AnswerCall(f.b.ctx, c.run, c.task, c.key, "forged", ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, key := range []string{w.Key, note.Key} {
		if st, err := f.orch.WriteStatus(f.b.ctx, key, ""); err != nil || st.State != runs.WriteIssued {
			t.Errorf("call %s is %s (%v) after answers naming another run, task or tool: want issued", key, st.State, err)
		}
	}
	if found, issued, err := rs.FanOutCall(f.b.ctx, "r1", "t1", w.Key); err != nil || !found || !issued {
		t.Fatalf("FanOutCall of the call itself: found %v, issued %v, %v", found, issued, err)
	}
	if err := rs.AnswerCall(f.b.ctx, "r1", "t1", w.Key, "child run c ended SUCCEEDED", ""); err != nil {
		t.Fatal(err)
	}
	if st, err := f.orch.WriteStatus(f.b.ctx, w.Key, ""); err != nil || st.State != runs.WriteDone {
		t.Errorf("the call answered under its own run and task is %s (%v), want done", st.State, err)
	}
	if _, issued, _ := rs.FanOutCall(f.b.ctx, "r1", "t1", w.Key); issued {
		t.Error("FanOutCall says an answered call is still issued")
	}
}
