package store_test

import (
	"errors"
	"testing"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store"
)

// endedExhausted opens run id of tenant "ten" (limit 1000, 100 held for its
// synthesis, tasks a and b), finishes task a SUCCEEDED, marks b NOT_STARTED
// and closes the run BUDGET_EXHAUSTED, as a run whose forecast declined b.
func endedExhausted(t *testing.T, b *testBundle, rs *store.Runs, id string) {
	t.Helper()
	open := budget.OpenRunParams{RunID: id, TenantID: "ten", Limit: 1000, MinReservation: 10, Held: 100,
		Tasks: []budget.TaskBudget{{TaskID: "a", Limit: 400}, {TaskID: "b", Limit: 400}}}
	if _, _, _, err := rs.OpenRun(b.ctx, draftRun(id, "ten", "k-"+id, "a", "b"), "node1", open, nil, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.FinishTask(b.ctx, id, "node1", &fanoutv1.TaskOutcome{TaskId: "a",
		Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED}); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.FinishTask(b.ctx, id, "node1", &fanoutv1.TaskOutcome{TaskId: "b",
		Status: fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED}); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.CloseRun(b.ctx, id, "node1", 0, fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED, "declined", nil); err != nil {
		t.Fatal(err)
	}
}

// TestContinueRunAtTheLedgersEdges (docs/ledger.md#continuations): each
// outcome of ledger_continue_run, at its edge; a refusal writes nothing.
func TestContinueRunAtTheLedgersEdges(t *testing.T) {
	b := setup(t)
	rs := store.NewRuns(b.pool)
	endedExhausted(t, b, rs, "r1")
	req := runs.Continue{RunID: "r1", TenantID: "ten", Key: "k1", Owner: "node2", Actor: "key:x", Add: 500, Held: 100,
		MaxLimit: 1500, Tasks: []string{"b"}}
	journal := func() (n int) {
		t.Helper()
		if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM ledger_entry WHERE run_id = 'r1')
			+ (SELECT count(*) FROM run_continuation)`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	refused := func(name string, c runs.Continue, outcome string, tokens int64) {
		t.Helper()
		before := journal()
		_, err := rs.ContinueRun(b.ctx, c)
		var e *runs.ContinueError
		if !errors.As(err, &e) || e.Outcome != outcome || e.Tokens != tokens {
			t.Errorf("%s: %v, want %s (tokens %d)", name, err, outcome, tokens)
		}
		if after := journal(); after != before {
			t.Errorf("%s wrote %d rows", name, after-before)
		}
	}
	// The cap: 1000 + 501 passes 1500 by one; the most is 500.
	over := req
	over.Add = 501
	refused("one token over the cap", over, "over_cap", 500)
	// A task that ran is never admitted again.
	ran := req
	ran.Tasks = []string{"a", "b"}
	if _, err := rs.ContinueRun(b.ctx, ran); err == nil {
		t.Error("reopening for task a, which SUCCEEDED: no error")
	}

	done, err := rs.ContinueRun(b.ctx, req)
	if err != nil || done.Replay || !done.Continuation.GetReopened() || done.Continuation.GetLimitTokens() != 1500 {
		t.Fatalf("continue: %+v, %v; want reopened with limit 1500", done, err)
	}
	var state, taskB, taskA, runState string
	var limit, held, tenantHeld int64
	if err := b.pool.QueryRow(b.ctx, `SELECT a.state, a.limit_tokens, a.held,
		       (SELECT state FROM account WHERE run_id = 'r1' AND task_id = 'b'),
		       (SELECT state FROM account WHERE run_id = 'r1' AND task_id = 'a'),
		       (SELECT state FROM run WHERE run_id = 'r1'),
		       coalesce((SELECT held FROM account WHERE account_id = a.parent_id), 0)
		  FROM account a WHERE a.run_id = 'r1' AND a.kind = 'run'`).
		Scan(&state, &limit, &held, &taskB, &taskA, &runState, &tenantHeld); err != nil {
		t.Fatal(err)
	}
	if state != "open" || limit != 1500 || held != 100 || tenantHeld != 0 || taskB != "open" || taskA != "closed" ||
		runState != "RUNNING" {
		t.Errorf("after the reopening: run account %s, limit %d, held %d (tenant %d); task b %s, a %s; run %s; "+
			"want open, 1500, 100 (no tenant account), b open, a closed, RUNNING", state, limit, held, tenantHeld, taskB, taskA, runState)
	}
	// Once per key: the same key returns the continuation and writes
	// nothing; with another amount it is a conflict.
	before := journal()
	again, err := rs.ContinueRun(b.ctx, req)
	if err != nil || !again.Replay || again.Continuation.GetContinuation() != 1 || journal() != before {
		t.Errorf("retry: %+v, %v (%d rows written); want the first continuation, nothing written", again, err, journal()-before)
	}
	other := req
	other.Add = 7
	refused("the key with another amount", other, "conflict", 0)
	// A top-up of the running run: the limit only.
	top := req
	top.Key, top.Add, top.MaxLimit, top.Tasks = "k2", 10, 2000, nil
	if done, err := rs.ContinueRun(b.ctx, top); err != nil || done.Continuation.GetReopened() ||
		done.Continuation.GetLimitTokens() != 1510 || done.Continuation.GetContinuation() != 2 {
		t.Errorf("top-up: %+v, %v; want continuation 2 to 1510, not reopened", done, err)
	}
	// A cancelled run is not continued.
	if _, err := rs.CloseRun(b.ctx, "r1", "node2", done.Epoch, fanoutv1.RunState_RUN_STATE_CANCELLED, "stop", nil); err != nil {
		t.Fatal(err)
	}
	late := req
	late.Key = "k3"
	refused("a cancelled run", late, "ended", 0)
	// Another tenant's run is not found.
	theirs := req
	theirs.TenantID, theirs.Key = "other", "k4"
	if _, err := rs.ContinueRun(b.ctx, theirs); !errors.Is(err, runs.ErrNotFound) {
		t.Errorf("another tenant's run: %v, want not found", err)
	}
}
