package subagent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
	fanoutnode "github.com/fanout/fanout/node"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// countingLedger counts the reserves of each task's second iteration
// (reserve keys ending in "/i2") before they reach the ledger.
type countingLedger struct {
	budget.Ledger
	second atomic.Int64
}

func (l *countingLedger) Reserve(ctx context.Context, p budget.ReserveParams) (budget.Reservation, error) {
	if strings.HasSuffix(p.Key, "/i2") {
		l.second.Add(1)
	}
	return l.Ledger.Reserve(ctx, p)
}

// TestWoundDownTasksAnswerWithoutToolsThroughGroupCommit is
// TestWoundDownTaskAnswersWithoutTools through the ledger a real worker
// gets: package node's backend with group commit (--group-commit, on by
// default), whose reserves that arrive together are one
// ledger_reserve_batch, answered by its set-based path. Four tasks of a run
// are wound down after their first iteration; their next reserves are made
// to arrive together (the run account's row is locked while they are
// asked for: the first waits on it in the database, the others for the
// committer, and all but the first go in one batch). Every grant says the
// task winds down, so each task makes that iteration its last: its call
// offers no tool and is told to answer, no tool runs after it, and it
// ends SUCCEEDED, wound down, after 2 iterations. Rounds (each a new run)
// go on until one shows grants of the second iteration written by one
// transaction (the same created_at), so the batch path is known to have
// answered.
func TestWoundDownTasksAnswerWithoutToolsThroughGroupCommit(t *testing.T) {
	t.Parallel()
	url := storetest.NewDB(t)
	pool, err := store.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	orch := store.NewLedger(pool) // the orchestrator's side: opens the runs, winds tasks down
	backend, err := fanoutnode.OpenBackend(t.Context(), fanoutnode.BackendConfig{DatabaseURL: url, GroupCommit: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(backend.Close)
	worker := &countingLedger{Ledger: backend.Ledger()}

	const tasks = 4
	for round := 0; ; round++ {
		if round == 5 {
			t.Fatal("5 rounds and no two wound-down grants shared a transaction: the batch path was not exercised")
		}
		if batched := windDownRound(t, pool, orch, worker, fmt.Sprintf("run-%d", round), tasks); batched {
			return
		}
	}
}

// windDownRound runs one round of TestWoundDownTasksAnswerWithoutToolsThroughGroupCommit
// on a new run, and reports whether two of its second-iteration grants
// were written by one transaction.
func windDownRound(t *testing.T, pool *store.Pool, orch *store.Ledger, worker *countingLedger, runID string, n int) (batched bool) {
	t.Helper()
	ctx := t.Context()
	p := budget.OpenRunParams{RunID: runID, TenantID: "t1", Limit: 1_000_000, MinReservation: 50}
	for i := range n {
		p.Tasks = append(p.Tasks, budget.TaskBudget{TaskID: fmt.Sprintf("t%d", i), Limit: 50_000})
	}
	accts, err := orch.OpenRun(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range accts.Tasks {
		if _, err := orch.BeginAttempt(ctx, id, runID, "t1"); err != nil {
			t.Fatal(err)
		}
	}
	worker.second.Store(0)
	sim := newSim(t, llm.SimConfig{ToolCallsPerIteration: 2, FinishAfter: 4, Facts: 3})
	rec := &recordingSim{Sim: sim}
	arrived, release := make(chan struct{}, n), make(chan struct{})
	waits := make(map[string]func(string) subagent.Summary, n)
	for i := range n {
		id := fmt.Sprintf("t%d", i)
		loop := &subagent.Loop{Ledger: worker, Model: rec, Holder: "w1", MaxOutputTokens: 200}
		loop.ProgressFunc = func(pr subagent.Progress) {
			if pr.Iteration != 1 { // before the task asks for its next grant
				return
			}
			if err := orch.WindDown(ctx, runID, 0, []string{id}); err != nil {
				t.Error(err)
			}
			arrived <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done(): // the test failed before it released them
			}
		}
		waits[id] = goRun(t, ctx, loop, subagent.Task{RunID: runID, TenantID: "t1", TaskID: id, Goal: "learn",
			Instruction: "find facts about " + id, Account: accts.Tasks[id], MinReservation: 50,
			AllowedTools: []string{"search", "fetch"}})
	}
	for range n {
		await(t, arrived, "every task wound down after its first iteration")
	}
	// Hold the run account's row while the tasks ask for their next grants.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT FROM account WHERE account_id = $1 FOR UPDATE`, int64(accts.Run.ID)); err != nil {
		t.Fatal(err)
	}
	close(release)
	deadline := time.Now().Add(patience)
	for {
		var waiting int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'
			  AND query LIKE '%ledger_reserve%'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 && worker.second.Load() == int64(n) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %d reserves waiting on the run's row, %d of %d second reserves asked for",
				patience, waiting, worker.second.Load(), n)
		}
		time.Sleep(10 * time.Millisecond) // polling the database and a counter, bounded by patience
	}
	if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatal(err)
	}

	for id, wait := range waits {
		sum := wait("task " + id)
		if sum.Status != subagent.StatusSucceeded || !sum.WoundDown || sum.Iterations != 2 {
			t.Errorf("task %s: status %s, wound down %v, %d iterations (err %v); want SUCCEEDED, wound down, after 2",
				id, sum.Status, sum.WoundDown, sum.Iterations, sum.Err)
		}
		if len(sum.Tried) != 2 {
			t.Errorf("task %s tried %q; want only the first iteration's 2 tool calls", id, sum.Tried)
		}
		if len(sum.Facts) == 0 {
			t.Errorf("task %s: no facts; a wound-down task hands back what it found", id)
		}
	}
	calls := map[string]int{}
	for _, req := range rec.requests() {
		calls[req.Meta.TaskID]++
		if req.Meta.Iteration != 2 {
			continue
		}
		if len(req.Tools) != 0 {
			t.Errorf("task %s: the wound-down call offered %d tools; want none", req.Meta.TaskID, len(req.Tools))
		}
		if m := req.Messages[len(req.Messages)-1]; !strings.Contains(m.Content, "last turn") {
			t.Errorf("task %s: the wound-down call's last message is %q; want it told to answer now", req.Meta.TaskID, m.Content)
		}
	}
	if n := rec.compressions.Load(); n != 0 {
		t.Errorf("%d compression calls; want none after a wind-down", n)
	}
	for id := range waits {
		if calls[id] != 2 {
			t.Errorf("task %s made %d iteration calls; want 2: its first and its wound-down last", id, calls[id])
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	var grants, transactions int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT created_at) FROM reservation
		WHERE run_id = $1 AND reserve_key LIKE '%/i2'`, runID).Scan(&grants, &transactions); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d second-iteration grants written by %d transactions", runID, grants, transactions)
	return transactions < grants
}
