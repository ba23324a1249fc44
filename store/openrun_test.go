package store_test

import (
	"errors"
	"testing"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store"
)

// TestOpenRunIsOneWrite: OpenRun stores the run, opens its ledger accounts
// and appends its first events in one transaction (the run's row, every
// account and every event carry the same xmin); a retry under the same
// idempotency key writes nothing and does not ask for events; a ledger
// refusal (an unknown tenant account) leaves no run behind.
func TestOpenRunIsOneWrite(t *testing.T) {
	b := setup(t)
	rs := store.NewRuns(b.pool)
	open := budget.OpenRunParams{RunID: "r1", TenantID: "ten", Limit: 1000, MinReservation: 10, Held: 100,
		Tasks: []budget.TaskBudget{{TaskID: "a", Limit: 400}, {TaskID: "b", Limit: 400}}}
	asked := 0
	first := func(stored *fanoutv1.Run, accounts budget.RunAccounts) []*fanoutv1.RunEvent {
		asked++
		if stored.GetCreatedAt() == nil || accounts.Run.Held != 100 || len(accounts.Tasks) != 2 {
			t.Errorf("first: run %v, accounts %+v: want the stored run and its accounts", stored, accounts)
		}
		return []*fanoutv1.RunEvent{
			{Event: &fanoutv1.RunEvent_RunStarted{RunStarted: &fanoutv1.RunStarted{Run: stored}}},
			{Event: &fanoutv1.RunEvent_TaskQueued{TaskQueued: &fanoutv1.TaskQueued{TaskId: "a"}}},
		}
	}
	run, accounts, created, err := rs.OpenRun(b.ctx, draftRun("r1", "ten", "k", "a", "b"), "node1", open, first)
	if err != nil || !created || asked != 1 {
		t.Fatalf("open: %v, created %v, first asked %d times", err, created, asked)
	}
	if run.GetRunId() != "r1" || run.GetCreatedAt() == nil || accounts.Run.ID == 0 || accounts.Tasks["b"] == 0 {
		t.Errorf("opened run %v, accounts %+v", run, accounts)
	}
	evs, err := rs.Events(b.ctx, "ten", "r1", 0, 10)
	if err != nil || len(evs) != 2 || evs[0].GetRunStarted() == nil || evs[1].GetTaskQueued().GetTaskId() != "a" ||
		evs[0].GetSequence() != 1 || evs[1].GetSequence() != 2 {
		t.Fatalf("events: %v, %v; want RunStarted then TaskQueued, sequences 1 and 2", evs, err)
	}
	var xmins []string
	rows, err := b.pool.Query(b.ctx, `SELECT xmin::text FROM fanout.run WHERE run_id = 'r1'
		UNION SELECT xmin::text FROM fanout.task WHERE run_id = 'r1'
		UNION SELECT xmin::text FROM fanout.account WHERE run_id = 'r1'
		UNION SELECT xmin::text FROM fanout.run_event WHERE run_id = 'r1'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var x string
		if err := rows.Scan(&x); err != nil {
			t.Fatal(err)
		}
		xmins = append(xmins, x)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(xmins) != 1 {
		t.Errorf("run, tasks, accounts and events written by transactions %v: want one", xmins)
	}

	again, accounts, created, err := rs.OpenRun(b.ctx, draftRun("r2", "ten", "k", "a", "b"), "node2",
		budget.OpenRunParams{RunID: "r2", TenantID: "ten", Limit: 1000, MinReservation: 10,
			Tasks: []budget.TaskBudget{{TaskID: "a", Limit: 400}, {TaskID: "b", Limit: 400}}}, first)
	if err != nil || created || again.GetRunId() != "r1" || accounts.Run.ID != 0 || asked != 1 {
		t.Errorf("same key: run %s, created %v, accounts %+v, err %v, first asked %d times; want r1, false, none, 1",
			again.GetRunId(), created, accounts, err, asked)
	}

	_, _, _, err = rs.OpenRun(b.ctx, draftRun("r3", "ten", "k3", "a"), "node1",
		budget.OpenRunParams{RunID: "r3", TenantID: "ten", TenantAccount: 1 << 40, Limit: 1000, MinReservation: 10,
			Tasks: []budget.TaskBudget{{TaskID: "a", Limit: 400}}}, first)
	if !errors.Is(err, budget.ErrNotFound) {
		t.Errorf("unknown tenant account: %v, want budget.ErrNotFound", err)
	}
	if _, err := rs.RunByKey(b.ctx, "ten", "k3"); !errors.Is(err, runs.ErrNotFound) {
		t.Errorf("the run the ledger refused: %v, want runs.ErrNotFound (nothing written)", err)
	}
	if _, err := b.ledger.RunAccount(b.ctx, "r3"); !errors.Is(err, budget.ErrNotFound) {
		t.Errorf("the refused run's account: %v, want budget.ErrNotFound", err)
	}
}
