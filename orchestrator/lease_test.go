package orchestrator_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent/llm"
)

// errKilled is what a replica that lost its database gets from every call.
var errKilled = errors.New("test: this replica was killed")

// cutStore is a RunStore that fails every call once cut.
type cutStore struct {
	orchestrator.RunStore
	cut *atomic.Bool
}

func (s cutStore) check() error {
	if s.cut.Load() {
		return errKilled
	}
	return nil
}

func (s cutStore) CreateRun(ctx context.Context, run *fanoutv1.Run, owner string) (*fanoutv1.Run, bool, error) {
	if err := s.check(); err != nil {
		return nil, false, err
	}
	return s.RunStore.CreateRun(ctx, run, owner)
}

func (s cutStore) GetRun(ctx context.Context, tenantID, runID string) (*fanoutv1.Run, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.RunStore.GetRun(ctx, tenantID, runID)
}

func (s cutStore) ListRuns(ctx context.Context, tenantID string, state fanoutv1.RunState, beforeCreated time.Time,
	beforeID string, limit int) ([]*fanoutv1.Run, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.RunStore.ListRuns(ctx, tenantID, state, beforeCreated, beforeID, limit)
}

func (s cutStore) StartTask(ctx context.Context, runID, taskID, worker string) (*fanoutv1.TaskOutcome, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.RunStore.StartTask(ctx, runID, taskID, worker)
}

func (s cutStore) FinishTask(ctx context.Context, runID string, o *fanoutv1.TaskOutcome) (*fanoutv1.TaskOutcome, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.RunStore.FinishTask(ctx, runID, o)
}

func (s cutStore) FinishRun(ctx context.Context, runID, owner string, state fanoutv1.RunState, cause string,
	result *fanoutv1.JoinedResult) (*fanoutv1.Run, bool, error) {
	if err := s.check(); err != nil {
		return nil, false, err
	}
	return s.RunStore.FinishRun(ctx, runID, owner, state, cause, result)
}

func (s cutStore) Heartbeat(ctx context.Context, owner string, runIDs []string) ([]string, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.RunStore.Heartbeat(ctx, owner, runIDs)
}

func (s cutStore) AdoptOrphan(ctx context.Context, node string, orphanAfter time.Duration) (string, string, error) {
	if err := s.check(); err != nil {
		return "", "", err
	}
	return s.RunStore.AdoptOrphan(ctx, node, orphanAfter)
}

func (s cutStore) FailTasks(ctx context.Context, runID, reason string) ([]*fanoutv1.TaskOutcome, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.RunStore.FailTasks(ctx, runID, reason)
}

func (s cutStore) AppendEvent(ctx context.Context, runID string, ev *fanoutv1.RunEvent) (*fanoutv1.RunEvent, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.RunStore.AppendEvent(ctx, runID, ev)
}

func (s cutStore) AppendEvents(ctx context.Context, runID string, evs []*fanoutv1.RunEvent) ([]*fanoutv1.RunEvent, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.RunStore.AppendEvents(ctx, runID, evs)
}

func (s cutStore) Events(ctx context.Context, tenantID, runID string, after int64, limit int) ([]*fanoutv1.RunEvent, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.RunStore.Events(ctx, tenantID, runID, after, limit)
}

// cutLedger is a ledger whose run calls (the ones an orchestrator makes)
// fail once cut.
type cutLedger struct {
	budget.Ledger
	cut *atomic.Bool
}

func (l cutLedger) OpenRun(ctx context.Context, p budget.OpenRunParams) (budget.RunAccounts, error) {
	if l.cut.Load() {
		return budget.RunAccounts{}, errKilled
	}
	return l.Ledger.OpenRun(ctx, p)
}

func (l cutLedger) CancelRun(ctx context.Context, runID, cause string) (budget.Account, error) {
	if l.cut.Load() {
		return budget.Account{}, errKilled
	}
	return l.Ledger.CancelRun(ctx, runID, cause)
}

func (l cutLedger) CloseRun(ctx context.Context, runID string) (budget.Account, error) {
	if l.cut.Load() {
		return budget.Account{}, errKilled
	}
	return l.Ledger.CloseRun(ctx, runID)
}

func (l cutLedger) Account(ctx context.Context, id budget.AccountID) (budget.Account, error) {
	if l.cut.Load() {
		return budget.Account{}, errKilled
	}
	return l.Ledger.Account(ctx, id)
}

func (l cutLedger) RunAccount(ctx context.Context, runID string) (budget.Account, error) {
	if l.cut.Load() {
		return budget.Account{}, errKilled
	}
	return l.Ledger.RunAccount(ctx, runID)
}

// lookingStore counts the orphan searches a replica completed.
type lookingStore struct {
	orchestrator.RunStore
	looks *atomic.Int64
}

func (s lookingStore) AdoptOrphan(ctx context.Context, node string, orphanAfter time.Duration) (string, string, error) {
	runID, prev, err := s.RunStore.AdoptOrphan(ctx, node, orphanAfter)
	if err == nil {
		s.looks.Add(1)
	}
	return runID, prev, err
}

// countLooks makes a replica count its orphan searches in looks.
func countLooks(looks *atomic.Int64) func(*orchestrator.EngineParams) {
	return func(p *orchestrator.EngineParams) { p.Store = lookingStore{RunStore: p.Store, looks: looks} }
}

// awaitLooks waits until the replica counting in looks has completed n more
// orphan searches. With n >= 2, one of them started after awaitLooks was
// called.
func awaitLooks(t *testing.T, looks *atomic.Int64, n int64, who string) {
	t.Helper()
	from := looks.Load()
	deadline := time.Now().Add(patience)
	for looks.Load() < from+n {
		if time.Now().After(deadline) {
			t.Fatalf("%s completed %d orphan searches within %v, want %d", who, looks.Load()-from, patience, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// dbNow is the database's clock.
func dbNow(t *testing.T, b *testBundle) time.Time {
	t.Helper()
	var now time.Time
	if err := b.pool.QueryRow(t.Context(), `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// leaseConfig is a fleet's lease timing, short for tests.
func leaseConfig() orchestrator.Config {
	return orchestrator.Config{HeartbeatInterval: 50 * time.Millisecond, OrphanAfter: 600 * time.Millisecond,
		WatchPollInterval: 50 * time.Millisecond}
}

// awaitTasks polls the run until n of its tasks are RUNNING.
func awaitTasks(t *testing.T, c fanoutv1.OrchestratorServiceClient, runID string, n int) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		got, err := c.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: runID})
		if err != nil {
			t.Fatal(err)
		}
		running := 0
		for _, o := range got.GetRun().GetTasks() {
			if o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_RUNNING {
				running++
			}
		}
		if running >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d tasks running after %v, want %d", running, patience, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func owner(t *testing.T, b *testBundle, runID string) string {
	t.Helper()
	var o string
	if err := b.pool.QueryRow(t.Context(), `SELECT owner FROM run WHERE run_id = $1`, runID).Scan(&o); err != nil {
		t.Fatal(err)
	}
	return o
}

func countFinished(evs []*fanoutv1.RunEvent) (runs int, tasks map[string]int) {
	tasks = map[string]int{}
	for _, ev := range evs {
		if ev.GetRunFinished() != nil {
			runs++
		}
		if f := ev.GetTaskFinished(); f != nil {
			tasks[f.GetOutcome().GetTaskId()]++
		}
	}
	return runs, tasks
}

// checkAdopted checks a run that ended through adoption after its owner
// was lost: FAILED with the cause, every task terminal (the unfinished ones
// failed with "orchestrator lost"), one RunFinished last, every task's
// TaskFinished once, the ledger run closed and conserved.
func checkAdopted(t *testing.T, b *testBundle, c fanoutv1.OrchestratorServiceClient, s *fanoutv1.RunSpec,
	runID, lostOwner string) *fanoutv1.Run {
	t.Helper()
	evs := watchAll(t, c, runID)
	fin := checkEvents(t, evs)
	wantCause := fmt.Sprintf("orchestrator %s lost before the run ended", lostOwner)
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_FAILED || fin.GetCancelCause() != wantCause {
		t.Errorf("run ended %s (%q), want FAILED (%q)", fin.GetState(), fin.GetCancelCause(), wantCause)
	}
	got, err := c.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	run := got.GetRun()
	if run.GetState() != fanoutv1.RunState_RUN_STATE_FAILED || run.GetCancelCause() != wantCause || run.GetResult() == nil {
		t.Errorf("stored run: %s (%q), result %v", run.GetState(), run.GetCancelCause(), run.GetResult())
	}
	checkDispatchOrder(t, s, run.GetTasks())
	if len(fin.GetResult().GetTasks()) != len(s.GetTasks()) {
		t.Errorf("joined result lists %d tasks, want %d", len(fin.GetResult().GetTasks()), len(s.GetTasks()))
	}
	runsFinished, tasksFinished := countFinished(evs)
	if runsFinished != 1 {
		t.Errorf("%d RunFinished events, want 1", runsFinished)
	}
	for _, task := range s.GetTasks() {
		if n := tasksFinished[task.GetId()]; n != 1 {
			t.Errorf("task %s has %d TaskFinished events, want 1", task.GetId(), n)
		}
	}
	acct, err := b.ledger.RunAccount(t.Context(), runID)
	if err != nil || acct.State != budget.StateClosed {
		t.Errorf("ledger run: %v (%v), want closed", acct.State, err)
	}
	b.checkLedger(t)
	return run
}

// TestLostOrchestratorRunIsAdopted: replica a drives a long run and is
// killed: from then on every call it makes to the database fails (its
// store and ledger are cut), so its heartbeat stops and none of its
// end-of-run code reaches the database, which is all the rest of the fleet
// can see of a crashed node. Replica b adopts the run and ends it; a
// WatchRun on b sees it end.
func TestLostOrchestratorRunIsAdopted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "slow", llm.SimConfig{Latency: 30 * time.Second}, 8)
	var killed atomic.Bool
	a := b.orchestratorWith(t, "a", leaseConfig(), func(p *orchestrator.EngineParams) {
		p.Store = cutStore{RunStore: p.Store, cut: &killed}
		p.Ledger = cutLedger{Ledger: p.Ledger, cut: &killed}
	}, w)
	var looks atomic.Int64
	other := b.orchestratorWith(t, "b", leaseConfig(), countLooks(&looks), w)

	s := spec("lost", 4, 100_000)
	s.Limits = &fanoutv1.Limits{MaxConcurrency: 2} // two run, two stay queued
	start, err := a.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := start.GetRunId()
	awaitTasks(t, other.client, runID, 2)
	// While a heartbeats, nobody adopts its run: let twice the orphan window
	// pass in database time, then let b search for orphans after that.
	window := dbNow(t, b).Add(2 * leaseConfig().OrphanAfter)
	for deadline := time.Now().Add(patience); dbNow(t, b).Before(window); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the database clock did not pass %v within %v", window, patience)
		}
	}
	awaitLooks(t, &looks, 2, "b, after the orphan window,")
	if o := owner(t, b, runID); o != "a" {
		t.Fatalf("a live replica's run is owned by %q", o)
	}

	killed.Store(true)
	began := time.Now()
	run := checkAdopted(t, b, other.client, s, runID, "a")
	if d := time.Since(began); d > 15*time.Second {
		t.Errorf("adoption took %s", d)
	}
	for _, o := range run.GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_FAILED || o.GetSummary().GetError() != "orchestrator lost" {
			t.Errorf("task %s ended %s (%q), want FAILED (orchestrator lost)", o.GetTaskId(), o.GetStatus(), o.GetSummary().GetError())
		}
	}
	if o := owner(t, b, runID); o != "b" {
		t.Errorf("run owned by %q after adoption, want b", o)
	}
}

// TestStaleOwnerIsFenced: replica a stops heartbeating but goes on running
// (a long pause, a partition from its peers). Replica b adopts the run; a,
// hearing the ledger's cancel, ends its tasks and tries to end the run, but
// only the owner can end a run, so the history still ends with exactly one
// RunFinished, b's.
func TestStaleOwnerIsFenced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "slow", llm.SimConfig{Latency: 30 * time.Second}, 8)
	a := b.orchestrator(t, "a", leaseConfig(), w)
	other := b.orchestrator(t, "b", leaseConfig(), w)

	s := spec("stale", 4, 100_000)
	s.Limits = &fanoutv1.Limits{MaxConcurrency: 2}
	start, err := a.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := start.GetRunId()
	awaitTasks(t, other.client, runID, 2)
	a.engine.StopHeartbeat()

	checkAdopted(t, b, other.client, s, runID, "a")
	// a's driver ends too (its run context was cancelled through the
	// ledger); what it writes after that changes nothing.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := a.engine.Shutdown(ctx); err != nil {
		t.Fatalf("a did not end its driver: %v", err)
	}
	run := checkAdopted(t, b, a.client, s, runID, "a")
	for _, o := range run.GetTasks() {
		if o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			t.Errorf("task %s SUCCEEDED in a run cancelled mid-way", o.GetTaskId())
		}
	}
}

// TestRacingReplicasAdoptOnce: a run whose orchestrator died (a run row, its
// ledger accounts, one task finished, one running with a reservation held
// by a worker that died too, a stale heartbeat) is adopted by exactly one
// of two replicas that look for orphans at once.
func TestRacingReplicasAdoptOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runs := store.NewRuns(b.pool)
	s := spec("ghost", 3, 100_000)
	draft := &fanoutv1.Run{RunId: "ghost-run", TenantId: "t1", IdempotencyKey: s.GetIdempotencyKey(),
		State: fanoutv1.RunState_RUN_STATE_RUNNING, Spec: s}
	for i, task := range s.GetTasks() {
		draft.Tasks = append(draft.Tasks, &fanoutv1.TaskOutcome{TaskId: task.GetId(), DispatchIndex: int32(i)})
	}
	ctx := t.Context()
	if _, _, err := runs.CreateRun(ctx, draft, "ghost"); err != nil {
		t.Fatal(err)
	}
	accts, err := b.ledger.OpenRun(ctx, budget.OpenRunParams{RunID: "ghost-run", TenantID: "t1", Limit: 100_000,
		MinReservation: 10, Tasks: []budget.TaskBudget{{TaskID: "t00", Limit: 1000}, {TaskID: "t01", Limit: 1000}, {TaskID: "t02", Limit: 1000}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := runs.AppendEvent(ctx, "ghost-run", &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_RunStarted{
		RunStarted: &fanoutv1.RunStarted{Run: draft}}}); err != nil {
		t.Fatal(err)
	}
	done := &fanoutv1.TaskOutcome{TaskId: "t00", Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED, TokensSpent: 0,
		Summary: &fanoutv1.FactSummary{Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED, Facts: []*fanoutv1.Fact{{Text: "a fact"}}}}
	stored, err := runs.FinishTask(ctx, "ghost-run", done)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := runs.AppendEvent(ctx, "ghost-run", &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskFinished{
		TaskFinished: &fanoutv1.TaskFinished{Outcome: stored}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := runs.StartTask(ctx, "ghost-run", "t01", "dead-worker"); err != nil {
		t.Fatal(err)
	}
	// The dead worker's reservation is never settled: its lease runs out and
	// the sweeper counts it as spent (it is never voided: the worker may
	// have paid for a call).
	attempt, err := b.ledger.BeginAttempt(ctx, accts.Tasks["t01"], "ghost-run", accts.Run.TenantID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Reserve(ctx, budget.ReserveParams{Account: accts.Tasks["t01"], RunID: "ghost-run",
		TenantID: accts.Run.TenantID, Attempt: attempt, Want: 100, Min: 10,
		Holder: "dead-worker", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	sweepCtx, stopSweep := context.WithCancel(ctx)
	swept := make(chan struct{})
	go func() { defer close(swept); budget.Sweep(sweepCtx, b.ledger, 100*time.Millisecond, quietLogger) }()
	defer func() { stopSweep(); await(t, swept, "the sweeper stopping") }()
	if _, err := b.pool.Exec(ctx, `UPDATE run SET owner_heartbeat = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}

	cfg := leaseConfig()
	cfg.HeartbeatInterval = 10 * time.Millisecond // both look at once, often
	cfg.HeldWait = 20 * time.Second               // the lease runs out long before
	var looks1, looks2 atomic.Int64
	r1 := b.orchestratorWith(t, "r1", cfg, countLooks(&looks1))
	r2 := b.orchestratorWith(t, "r2", cfg, countLooks(&looks2))

	run := checkAdopted(t, b, r2.client, s, "ghost-run", "ghost")
	if o := owner(t, b, "ghost-run"); o != "r1" && o != "r2" {
		t.Errorf("owner %q, want r1 or r2", o)
	}
	tasks := run.GetTasks()
	if tasks[0].GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED || len(run.GetResult().GetFacts()) != 1 {
		t.Errorf("the finished task's outcome was not kept: %v, facts %v", tasks[0], run.GetResult().GetFacts())
	}
	for _, o := range tasks[1:] {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_FAILED || o.GetSummary().GetError() != "orchestrator lost" {
			t.Errorf("task %s ended %s (%q), want FAILED (orchestrator lost)", o.GetTaskId(), o.GetStatus(), o.GetSummary().GetError())
		}
	}
	if tasks[1].GetWorker() != "dead-worker" {
		t.Errorf("running task lost its worker: %q", tasks[1].GetWorker())
	}
	// Both replicas keep looking; the ended run stays ended once.
	awaitLooks(t, &looks1, 3, "r1, after the run ended,")
	awaitLooks(t, &looks2, 3, "r2, after the run ended,")
	evs := watchAll(t, r1.client, "ghost-run")
	if n, _ := countFinished(evs); n != 1 || evs[len(evs)-1].GetRunFinished() == nil {
		t.Errorf("%d RunFinished events (last event %T), want 1, last", n, evs[len(evs)-1].GetEvent())
	}
}
