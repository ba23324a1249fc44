package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// TestOpenRunIsOneWrite: OpenRun stores the run, opens its ledger accounts
// and appends its first events in one transaction (the run's row, every
// account and every event carry the same xmin); a retry under the same
// idempotency key writes nothing; RunStarted carries the run as stored and
// its account as opened; a ledger
// refusal (an unknown tenant account) leaves no run behind.
func TestOpenRunIsOneWrite(t *testing.T) {
	b := setup(t)
	rs := store.NewRuns(b.pool)
	open := budget.OpenRunParams{RunID: "r1", TenantID: "ten", Limit: 1000, MinReservation: 10, Held: 100,
		Tasks: []budget.TaskBudget{{TaskID: "a", Limit: 400}, {TaskID: "b", Limit: 400}}}
	queued := []*fanoutv1.RunEvent{{Event: &fanoutv1.RunEvent_TaskQueued{TaskQueued: &fanoutv1.TaskQueued{TaskId: "a"}}}}
	run, accounts, created, err := rs.OpenRun(b.ctx, draftRun("r1", "ten", "k", "a", "b"), "node1", open, nil, nil, []string{"b"}, queued)
	if err != nil || !created {
		t.Fatalf("open: %v, created %v", err, created)
	}
	if run.GetRunId() != "r1" || run.GetCreatedAt() == nil || accounts.Run.ID == 0 || accounts.Tasks["b"] == 0 {
		t.Errorf("opened run %v, accounts %+v", run, accounts)
	}
	// b's first attempt was begun with the run: it reserves with it, and
	// only b's.
	begun, ok := accounts.Attempts["b"]
	if len(accounts.Attempts) != 1 || !ok || begun.N != 1 || begun.Secret == "" {
		t.Fatalf("attempts begun with the run: %+v, want b's first", accounts.Attempts)
	}
	evs, err := rs.Events(b.ctx, "ten", "r1", 0, 10)
	if err != nil || len(evs) != 2 || evs[0].GetRunStarted() == nil || evs[1].GetTaskQueued().GetTaskId() != "a" ||
		evs[0].GetSequence() != 1 || evs[1].GetSequence() != 2 {
		t.Fatalf("events: %v, %v; want RunStarted then TaskQueued, sequences 1 and 2", evs, err)
	}
	// RunStarted carries the run as stored and its account as opened.
	started := evs[0].GetRunStarted().GetRun()
	if started.GetCreatedAt() == nil || !started.GetCreatedAt().AsTime().Equal(run.GetCreatedAt().AsTime()) ||
		started.GetBudget().GetLimitTokens() != 1000 || started.GetBudget().GetHeldTokens() != 100 ||
		started.GetBudget().GetAvailableTokens() != 900 {
		t.Errorf("RunStarted's run: created %v, budget %v; want %v, limit 1000, 100 held, 900 available",
			started.GetCreatedAt(), started.GetBudget(), run.GetCreatedAt())
	}
	xmins := b.xmins(t, `SELECT xmin::text FROM fanout.run WHERE run_id = 'r1'
		UNION SELECT xmin::text FROM fanout.task WHERE run_id = 'r1'
		UNION SELECT xmin::text FROM fanout.account WHERE run_id = 'r1' AND (kind = 'run' OR task_id IN ('a', 'b'))
		UNION SELECT xmin::text FROM fanout.run_event WHERE run_id = 'r1'`)
	if len(xmins) != 1 {
		t.Errorf("run, tasks, accounts and events written by transactions %v: want one", xmins)
	}
	if _, err := b.ledger.Reserve(b.ctx, budget.ReserveParams{Account: accounts.Tasks["b"], RunID: "r1", TenantID: "ten",
		Attempt: begun.N, Secret: begun.Secret, Want: 100, Min: 10, Holder: "w", TTL: time.Minute}); err != nil {
		t.Errorf("reserve with the attempt begun with the run: %v", err)
	}
	if _, err := b.ledger.Reserve(b.ctx, budget.ReserveParams{Account: accounts.Tasks["a"], RunID: "r1", TenantID: "ten",
		Attempt: 1, Secret: begun.Secret, Want: 100, Min: 10, Holder: "w", TTL: time.Minute}); !errors.Is(err, budget.ErrDenied) {
		t.Errorf("reserve on a, which has no attempt, with b's secret: %v, want budget.ErrDenied", err)
	}

	again, accounts, created, err := rs.OpenRun(b.ctx, draftRun("r2", "ten", "k", "a", "b"), "node2",
		budget.OpenRunParams{RunID: "r2", TenantID: "ten", Limit: 1000, MinReservation: 10,
			Tasks: []budget.TaskBudget{{TaskID: "a", Limit: 400}, {TaskID: "b", Limit: 400}}}, nil, nil, []string{"a"}, queued)
	if err != nil || created || again.GetRunId() != "r1" || accounts.Run.ID != 0 {
		t.Errorf("same key: run %s, created %v, accounts %+v, err %v; want r1, false, none",
			again.GetRunId(), created, accounts, err)
	}
	if evs, err := rs.Events(b.ctx, "ten", "r1", 0, 10); err != nil || len(evs) != 2 {
		t.Errorf("after the same key again, r1 has %d events (%v), want 2 (nothing appended)", len(evs), err)
	}

	_, _, _, err = rs.OpenRun(b.ctx, draftRun("r3", "ten", "k3", "a"), "node1",
		budget.OpenRunParams{RunID: "r3", TenantID: "ten", TenantAccount: 1 << 40, Limit: 1000, MinReservation: 10,
			Tasks: []budget.TaskBudget{{TaskID: "a", Limit: 400}}}, nil, nil, nil, queued)
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

// TestCloseRunIsOneWrite: CloseRun closes the ledger run, appends the
// closing BudgetUpdate (the closed account's) and ends the run in one
// transaction (the run account, the run's row and its last two events carry
// one xmin), with the result's total the ledger's spend; an owner epoch the run has left writes nothing.
func TestCloseRunIsOneWrite(t *testing.T) {
	b := setup(t)
	rs := store.NewRuns(b.pool)
	open := budget.OpenRunParams{RunID: "r1", TenantID: "ten", Limit: 1000, MinReservation: 10,
		Tasks: []budget.TaskBudget{{TaskID: "a", Limit: 400}}}
	_, accounts, _, err := rs.OpenRun(b.ctx, draftRun("r1", "ten", "k1", "a"), "node1", open, nil, nil, []string{"a"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	att := accounts.Attempts["a"]
	r, err := b.ledger.Reserve(b.ctx, budget.ReserveParams{Account: accounts.Tasks["a"], RunID: "r1", TenantID: "ten",
		Attempt: att.N, Secret: att.Secret, Want: 100, Min: 10, Holder: "w", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r.ID, Generation: r.Lease.Generation,
		Actual: 70, Secret: att.Secret}); err != nil {
		t.Fatal(err)
	}

	// A stale owner epoch: refused, nothing written.
	_, err = rs.CloseRun(b.ctx, "r1", "node1", 3, fanoutv1.RunState_RUN_STATE_SUCCEEDED, "",
		&fanoutv1.JoinedResult{})
	if !errors.Is(err, budget.ErrDenied) {
		t.Errorf("close with a stale epoch: %v, want budget.ErrDenied", err)
	}
	if a, err := b.ledger.RunAccount(b.ctx, "r1"); err != nil || a.State != budget.StateOpen {
		t.Errorf("after a refused close the run account is %v (%v), want open", a.State, err)
	}

	result := &fanoutv1.JoinedResult{}
	closing, err := rs.CloseRun(b.ctx, "r1", "node1", 0, fanoutv1.RunState_RUN_STATE_SUCCEEDED, "", result)
	run, acct := closing.Run, closing.Account
	if err != nil || !closing.Ended || acct == nil || acct.State != budget.StateClosed || acct.Spent != 70 {
		t.Fatalf("close: ended %v, account %+v, err %v; want ended, closed with 70 spent", closing.Ended, acct, err)
	}
	if run.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED || run.GetFinishedAt() == nil || result.GetTotalTokens() != 70 {
		t.Errorf("closed run %v, result total %d; want SUCCEEDED with its end time, 70", run, result.GetTotalTokens())
	}
	stored, err := rs.GetRun(b.ctx, "ten", "r1")
	if err != nil || stored.GetResult().GetTotalTokens() != 70 {
		t.Errorf("stored result total %d (%v), want 70", stored.GetResult().GetTotalTokens(), err)
	}
	// The row it returns without reading it back is the stored one.
	if !run.GetCreatedAt().AsTime().Equal(stored.GetCreatedAt().AsTime()) ||
		!run.GetFinishedAt().AsTime().Equal(stored.GetFinishedAt().AsTime()) {
		t.Errorf("closed run created %v, finished %v; stored %v, %v", run.GetCreatedAt().AsTime(),
			run.GetFinishedAt().AsTime(), stored.GetCreatedAt().AsTime(), stored.GetFinishedAt().AsTime())
	}
	evs, err := rs.Events(b.ctx, "ten", "r1", 0, 10)
	if err != nil || len(evs) != 3 || evs[0].GetRunStarted() == nil || evs[2].GetRunFinished() == nil {
		t.Fatalf("events %v (%v): want RunStarted, BudgetUpdate, RunFinished", evs, err)
	}
	// What it appended, handed back as a read of the log returns it: a
	// follower served these misses nothing a read would have given it.
	if len(closing.Events) != 2 || !proto.Equal(closing.Events[0], evs[1]) || !proto.Equal(closing.Events[1], evs[2]) {
		t.Errorf("closing events %v\nwant as read %v", closing.Events, evs[1:])
	}
	// The last budget view is the closed account's.
	if got := evs[1].GetBudgetUpdate().GetBudget(); got.GetSpentTokens() != 70 || got.GetLimitTokens() != 1000 ||
		got.GetReservedTokens() != 0 || got.GetAvailableTokens() != 930 {
		t.Errorf("closing BudgetUpdate %v: want 70 spent of 1000, none reserved, 930 available", got)
	}
	xmins := b.xmins(t, `SELECT xmin::text FROM fanout.run WHERE run_id = 'r1'
		UNION SELECT xmin::text FROM fanout.account WHERE run_id = 'r1' AND kind = 'run'
		UNION SELECT xmin::text FROM fanout.run_event WHERE run_id = 'r1' AND sequence > 1`)
	if len(xmins) != 1 {
		t.Errorf("run account close, closing events and run end written by transactions %v: want one", xmins)
	}
	// Again (a retry): nothing more.
	if again, err := rs.CloseRun(b.ctx, "r1", "node1", 0, fanoutv1.RunState_RUN_STATE_SUCCEEDED, "",
		&fanoutv1.JoinedResult{}); err != nil || again.Ended || len(again.Events) != 0 ||
		again.Run.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Errorf("close again: %+v, %v; want not ended, nothing appended, the run as stored, no error", again, err)
	}
	if evs, _ := rs.Events(b.ctx, "ten", "r1", 0, 10); len(evs) != 3 {
		t.Errorf("close again appended: %d events, want 3", len(evs))
	}
}

// TestBeginAttemptsAnswersAsBeginAttempt: ledger_begin_attempts begins the
// open task accounts of an open run in one statement, each with its own
// secret, and answers every other account as ledger_begin_attempt would;
// once the run is cancelled it begins none; accounts named twice are refused.
func TestBeginAttemptsAnswersAsBeginAttempt(t *testing.T) {
	b := setup(t)
	open := func(id string, tasks ...string) budget.RunAccounts {
		t.Helper()
		p := budget.OpenRunParams{RunID: id, TenantID: "tenant-a", Limit: 1000, MinReservation: 10}
		for _, task := range tasks {
			p.Tasks = append(p.Tasks, budget.TaskBudget{TaskID: task, Limit: 100})
		}
		ra, err := b.ledger.OpenRun(b.ctx, p) // no attempt begun
		if err != nil {
			t.Fatal(err)
		}
		return ra
	}
	r1, r2 := open("r1", "t0", "t1", "t2"), open("r2", "t0")
	type row struct {
		outcome string
		attempt int64
		secret  *string
	}
	begin := func(ids ...int64) map[int64]row {
		t.Helper()
		out := map[int64]row{}
		rows, err := b.pool.Query(b.ctx, `SELECT account_id, outcome, attempt, secret FROM ledger_begin_attempts($1, 'r1', 'tenant-a')`, ids)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id int64
			var r row
			if err := rows.Scan(&id, &r.outcome, &r.attempt, &r.secret); err != nil {
				t.Fatal(err)
			}
			out[id] = r
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	t0, t1, other := int64(r1.Tasks["t0"]), int64(r1.Tasks["t1"]), int64(r2.Tasks["t0"])
	got := begin(t1, t0, other, 1<<40)
	if len(got) != 4 || got[t0].outcome != "ok" || got[t0].attempt != 1 || got[t1].outcome != "ok" ||
		got[t0].secret == nil || got[t1].secret == nil || *got[t0].secret == *got[t1].secret ||
		got[other].outcome != "denied" || got[1<<40].outcome != "not_found" {
		t.Fatalf("begin t1, t0, another run's task, an unknown account: %+v", got)
	}
	// Each secret is its own account's: a worker's login holding t0's
	// reserves on t0, not on t1.
	pool, err := store.OpenPool(b.ctx, storetest.WorkerURL(t, b.url), store.PoolConfig{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	worker := store.NewLedger(pool)
	if _, err := worker.Reserve(b.ctx, budget.ReserveParams{Account: r1.Tasks["t0"], RunID: "r1", TenantID: "tenant-a",
		Attempt: 1, Secret: *got[t0].secret, Want: 50, Min: 10, Holder: "w", TTL: time.Minute}); err != nil {
		t.Errorf("reserve on t0 with its secret: %v", err)
	}
	if _, err := worker.Reserve(b.ctx, budget.ReserveParams{Account: r1.Tasks["t1"], RunID: "r1", TenantID: "tenant-a",
		Attempt: 1, Secret: *got[t0].secret, Want: 50, Min: 10, Holder: "w", TTL: time.Minute}); !errors.Is(err, budget.ErrDenied) {
		t.Errorf("reserve on t1 with t0's secret: %v, want budget.ErrDenied", err)
	}
	// Again: attempt 2, fencing the first.
	if again := begin(t0); again[t0].outcome != "ok" || again[t0].attempt != 2 {
		t.Errorf("begin t0 again: %+v, want attempt 2", again)
	}
	for _, bad := range []struct {
		sql, want string
	}{
		{`SELECT ledger_begin_attempts(ARRAY[$1, $1]::bigint[], 'r1', 'tenant-a')`, "not distinct"},
		{`SELECT ledger_begin_attempts(ARRAY[$1, NULL]::bigint[], 'r1', 'tenant-a')`, "include NULL"},
		{`SELECT ledger_begin_attempts(ARRAY[$1, (SELECT account_id FROM account WHERE run_id = 'r1' AND kind = 'run')], 'r1', 'tenant-a')`,
			"not a task's"},
	} {
		if _, err := b.pool.Exec(b.ctx, bad.sql, t0); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want refused (%s)", bad.sql, err, bad.want)
		}
	}
	if _, err := b.ledger.CancelRun(b.ctx, "r1", "cancelled by caller"); err != nil {
		t.Fatal(err)
	}
	if got := begin(int64(r1.Tasks["t2"])); got[int64(r1.Tasks["t2"])].outcome != "exhausted" || got[int64(r1.Tasks["t2"])].secret != nil {
		t.Errorf("begin on a cancelled run: %+v, want exhausted without a secret", got)
	}
}

// xmins returns the distinct transactions (xmin) that wrote the rows query
// selects (one xmin::text column).
func (b *testBundle) xmins(t *testing.T, query string) []string {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, query)
	if err != nil {
		t.Fatal(err)
	}
	xmins, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return xmins
}
