package orchestrator_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
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

func (s cutStore) OpenRun(ctx context.Context, run *fanoutv1.Run, owner string, open budget.OpenRunParams,
	tools []runs.ToolPolicy, keys, begin []string, queued []*fanoutv1.RunEvent) (*fanoutv1.Run, budget.RunAccounts, bool, error) {
	if err := s.check(); err != nil {
		return nil, budget.RunAccounts{}, false, err
	}
	return s.RunStore.OpenRun(ctx, run, owner, open, tools, keys, begin, queued)
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

func (s cutStore) StartTask(ctx context.Context, runID, owner string, started *fanoutv1.TaskStarted) (*fanoutv1.TaskOutcome, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.RunStore.StartTask(ctx, runID, owner, started)
}

func (s cutStore) FinishTask(ctx context.Context, runID, owner string, o *fanoutv1.TaskOutcome) (*fanoutv1.TaskOutcome, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.RunStore.FinishTask(ctx, runID, owner, o)
}

func (s cutStore) FinishRun(ctx context.Context, runID, owner string, state fanoutv1.RunState, cause string,
	result *fanoutv1.JoinedResult) (*fanoutv1.Run, bool, error) {
	if err := s.check(); err != nil {
		return nil, false, err
	}
	return s.RunStore.FinishRun(ctx, runID, owner, state, cause, result)
}

func (s cutStore) CloseRun(ctx context.Context, runID, owner string, epoch int64, state fanoutv1.RunState, cause string,
	result *fanoutv1.JoinedResult) (runs.Closing, error) {
	if err := s.check(); err != nil {
		return runs.Closing{}, err
	}
	return s.RunStore.CloseRun(ctx, runID, owner, epoch, state, cause, result)
}

func (s cutStore) Heartbeat(ctx context.Context, owner string, runIDs []string) ([]string, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.RunStore.Heartbeat(ctx, owner, runIDs)
}

func (s cutStore) AdoptOrphan(ctx context.Context, node string, orphanAfter time.Duration) (runs.Adoption, error) {
	if err := s.check(); err != nil {
		return runs.Adoption{}, err
	}
	return s.RunStore.AdoptOrphan(ctx, node, orphanAfter)
}

func (s cutStore) FailTasks(ctx context.Context, runID, owner, reason string) ([]*fanoutv1.TaskOutcome, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.RunStore.FailTasks(ctx, runID, owner, reason)
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

func (l cutLedger) EndRunFenced(ctx context.Context, runID string, state budget.AccountState, cause string,
	epoch int64) (budget.Account, error) {
	if l.cut.Load() {
		return budget.Account{}, errKilled
	}
	return l.Ledger.EndRunFenced(ctx, runID, state, cause, epoch)
}

func (l cutLedger) BeginAttempt(ctx context.Context, a budget.AccountID, runID, tenantID string) (budget.Attempt, error) {
	if l.cut.Load() {
		return budget.Attempt{}, errKilled
	}
	return l.Ledger.BeginAttempt(ctx, a, runID, tenantID)
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

// killableOrchestrator is a replica on workers whose kill makes it look
// dead to the rest of the fleet: nothing it does reaches the database from
// then on (its store and ledger are cut), and its calls to workers are cut
// (its streams end as a dead process's do).
func (b *testBundle) killableOrchestrator(t *testing.T, name string, workers ...string) (n *node, kill func()) {
	t.Helper()
	var killed atomic.Bool
	n = b.orchestratorWith(t, name, leaseConfig(), func(p *orchestrator.EngineParams) {
		p.Store = cutStore{RunStore: p.Store, cut: &killed}
		p.Ledger = cutLedger{Ledger: p.Ledger, cut: &killed}
	}, workers...)
	return n, func() {
		killed.Store(true)
		dead, cancel := context.WithCancel(t.Context())
		cancel()
		_ = n.engine.Shutdown(dead)
	}
}

// lookingStore counts the orphan searches a replica completed.
type lookingStore struct {
	orchestrator.RunStore
	looks *atomic.Int64
}

func (s lookingStore) AdoptOrphan(ctx context.Context, node string, orphanAfter time.Duration) (runs.Adoption, error) {
	a, err := s.RunStore.AdoptOrphan(ctx, node, orphanAfter)
	if err == nil {
		s.looks.Add(1)
	}
	return a, err
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

// awaitTasksIn polls the run until n of its tasks are in status st.
func awaitTasksIn(t *testing.T, c fanoutv1.OrchestratorServiceClient, runID string, st fanoutv1.TaskStatus, n int) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		got, err := c.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: runID})
		if err != nil {
			t.Fatal(err)
		}
		in := 0
		for _, o := range got.GetRun().GetTasks() {
			if o.GetStatus() == st {
				in++
			}
		}
		if in >= n {
			return
		}
		if s := got.GetRun().GetState(); s != fanoutv1.RunState_RUN_STATE_RUNNING && st == fanoutv1.TaskStatus_TASK_STATUS_RUNNING {
			t.Fatalf("run %s ended %s before %d of its tasks were seen %s: its calls are too short for this machine's load", runID, s, n, st)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d tasks %s after %v, want %d", in, st, patience, n)
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
// was lost and was not resumed: FAILED with wantCause, every task terminal,
// one RunFinished last, every task's TaskFinished once, the ledger run
// closed and conserved.
func checkAdopted(t *testing.T, b *testBundle, c fanoutv1.OrchestratorServiceClient, s *fanoutv1.RunSpec,
	runID, wantCause string) *fanoutv1.Run {
	t.Helper()
	evs := watchAll(t, c, runID)
	fin := checkEvents(t, evs)
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_FAILED || fin.GetCancelCause() != wantCause {
		t.Errorf("run ended %s (%q), want FAILED (%q)", fin.GetState(), fin.GetCancelCause(), wantCause)
	}
	run := checkEndedOnce(t, b, c, s, runID, evs)
	if run.GetState() != fanoutv1.RunState_RUN_STATE_FAILED || run.GetCancelCause() != wantCause || run.GetResult() == nil {
		t.Errorf("stored run: %s (%q), result %v", run.GetState(), run.GetCancelCause(), run.GetResult())
	}
	return run
}

// checkEndedOnce checks what every run that changed hands must show: one
// RunFinished, last; every task's TaskFinished exactly once; the joined
// result lists every task; no two attempts of a task held reservations at
// the same time; the ledger run closed and conserved.
func checkEndedOnce(t *testing.T, b *testBundle, c fanoutv1.OrchestratorServiceClient, s *fanoutv1.RunSpec,
	runID string, evs []*fanoutv1.RunEvent) *fanoutv1.Run {
	t.Helper()
	fin := evs[len(evs)-1].GetRunFinished()
	got, err := c.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	run := got.GetRun()
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
	storetest.CheckAttemptsApart(t, b.pool, runID)
	return run
}

// checkResumed checks a run that changed hands once, from lostOwner to
// adopter, and was driven on: it SUCCEEDED with every task, the history
// says who adopted it and which tasks it dispatched again, and the
// checks of checkEndedOnce hold.
func checkResumed(t *testing.T, b *testBundle, c fanoutv1.OrchestratorServiceClient, s *fanoutv1.RunSpec,
	runID, lostOwner, adopter string) *fanoutv1.RunAdopted {
	t.Helper()
	evs := watchAll(t, c, runID)
	fin := checkEvents(t, evs)
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Errorf("run ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	var adopted []*fanoutv1.RunAdopted
	for _, ev := range evs {
		if a := ev.GetRunAdopted(); a != nil {
			adopted = append(adopted, a)
		}
	}
	if len(adopted) != 1 {
		t.Fatalf("%d RunAdopted events, want 1", len(adopted))
	}
	a := adopted[0]
	if a.GetPreviousOwner() != lostOwner || a.GetOwner() != adopter || a.GetAdoptions() != 1 || len(a.GetResumedTaskIds()) == 0 {
		t.Errorf("RunAdopted %v, want from %s to %s, the first adoption, with the unfinished tasks", a, lostOwner, adopter)
	}
	run := checkEndedOnce(t, b, c, s, runID, evs)
	for _, o := range run.GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			t.Errorf("task %s ended %s (%q), want SUCCEEDED", o.GetTaskId(), o.GetStatus(), o.GetSummary().GetError())
		}
	}
	if o := owner(t, b, runID); o != adopter {
		t.Errorf("run owned by %q after adoption, want %s", o, adopter)
	}
	return a
}

// resumeSim is a worker whose tasks take a few calls of 300 ms: long enough
// that a run is mid-way when its orchestrator is lost, short enough that
// the calls cut off settle at once.
var resumeSim = llm.SimConfig{Latency: 300 * time.Millisecond, ToolCallsPerIteration: 1, FinishAfter: 2}

// TestLostOrchestratorRunIsResumed: replica a drives a run and is killed:
// from then on every call it makes to the database fails (its store and
// ledger are cut), so its heartbeat stops and none of its end-of-run code
// reaches the database, which is all the rest of the fleet can see of a
// crashed node. Replica b adopts the run and drives it on: the tasks that
// had ended keep their outcomes, the others run again as new attempts,
// and the run succeeds; a WatchRun on b sees all of it.
func TestLostOrchestratorRunIsResumed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w", resumeSim, 8)
	a, kill := b.killableOrchestrator(t, "a", w)
	var looks atomic.Int64
	other := b.orchestratorWith(t, "b", leaseConfig(), countLooks(&looks), w)

	s := spec("lost", 16, 1_000_000)
	s.Limits = &fanoutv1.Limits{MaxConcurrency: 2} // two run, the rest stay queued
	start, err := a.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := start.GetRunId()
	awaitTasksIn(t, other.client, runID, fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED, 1)
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

	kill()
	adopted := checkResumed(t, b, other.client, s, runID, "a", "b")
	if n := len(adopted.GetResumedTaskIds()); n == len(s.GetTasks()) {
		t.Errorf("every task was resumed: the kill came before any task ended")
	}
}

// TestStaleOwnerIsFenced: replica a's heartbeats stop reaching the
// database for a while but it goes on running (a long pause of its
// heartbeat, a partition on the path they take). It stops dispatching once
// its own clock says its lease may have lapsed; replica b adopts the run
// and resumes it, fencing a's attempts; then a's heartbeats get through
// again and find the run taken. a's task writes are refused (only the owner starts and
// ends tasks), so a abandons the run and writes nothing more: the history
// ends with exactly one RunFinished, b's, and every task ended once.
func TestStaleOwnerIsFenced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w", resumeSim, 8)
	var paused atomic.Bool
	a := b.orchestratorWith(t, "a", leaseConfig(), func(p *orchestrator.EngineParams) {
		p.Store = beatlessStore{RunStore: p.Store, off: &paused}
	}, w)
	other := b.orchestrator(t, "b", leaseConfig(), w)

	s := spec("stale", 16, 1_000_000)
	s.Limits = &fanoutv1.Limits{MaxConcurrency: 2}
	start, err := a.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := start.GetRunId()
	awaitTasksIn(t, other.client, runID, fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED, 1)
	paused.Store(true)
	waitOwner(t, b, runID, "b")
	paused.Store(false) // the pause ends: a's heartbeat finds the run taken

	checkResumed(t, b, other.client, s, runID, "a", "b")
	// a's driver ends too (its calls were fenced, its writes refused);
	// nothing it did after the adoption shows.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := a.engine.Shutdown(ctx); err != nil {
		t.Fatalf("a did not end its driver: %v", err)
	}
	checkResumed(t, b, a.client, s, runID, "a", "b")
}

// waitOwner polls until want owns the run.
func waitOwner(t *testing.T, b *testBundle, runID, want string) {
	t.Helper()
	for deadline := time.Now().Add(patience); owner(t, b, runID) != want; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("run owned by %q after %v, want %s", owner(t, b, runID), patience, want)
		}
	}
}

// beatlessStore is a RunStore whose heartbeats fail once off is set.
type beatlessStore struct {
	orchestrator.RunStore
	off *atomic.Bool
}

func (s beatlessStore) Heartbeat(ctx context.Context, owner string, runIDs []string) ([]string, error) {
	if s.off.Load() {
		return nil, errKilled
	}
	return s.RunStore.Heartbeat(ctx, owner, runIDs)
}

// TestRunAdoptedTooOftenEnds: a run that changed hands maxAdoptions times
// already is ended FAILED by the next adopter, not resumed.
func TestRunAdoptedTooOftenEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w", resumeSim, 8)
	a, kill := b.killableOrchestrator(t, "a", w)
	s := spec("poison", 2, 100_000)
	start, err := a.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := start.GetRunId()
	awaitTasksIn(t, a.client, runID, fanoutv1.TaskStatus_TASK_STATUS_RUNNING, 2)
	if _, err := b.pool.Exec(t.Context(), `UPDATE run SET adoptions = 3 WHERE run_id = $1`, runID); err != nil {
		t.Fatal(err)
	}
	kill()
	other := b.orchestrator(t, "b", leaseConfig(), w)
	run := checkAdopted(t, b, other.client, s, runID,
		"run adopted 4 times (its orchestrators kept being lost, the last was a); the limit is 3")
	for _, o := range run.GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_FAILED || o.GetSummary().GetError() != "orchestrator lost" {
			t.Errorf("task %s ended %s (%q), want FAILED (orchestrator lost)", o.GetTaskId(), o.GetStatus(), o.GetSummary().GetError())
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
	if _, err := runs.FinishTask(ctx, "ghost-run", "ghost", done); err != nil { // and its TaskFinished
		t.Fatal(err)
	}
	if _, err := runs.StartTask(ctx, "ghost-run", "ghost", &fanoutv1.TaskStarted{TaskId: "t01", Worker: "dead-worker"}); err != nil {
		t.Fatal(err)
	}
	// The dead worker's reservation is never settled: its lease runs out and
	// the sweeper counts it as spent (it is never voided: the worker may
	// have paid for a call).
	if _, err := lostAttempt(t, b, accts, "t01", "dead-worker", time.Second)(); err != nil {
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
	w, _ := b.worker(t, "w", resumeSim, 8)
	var looks1, looks2 atomic.Int64
	r1 := b.orchestratorWith(t, "r1", cfg, countLooks(&looks1), w)
	r2 := b.orchestratorWith(t, "r2", cfg, countLooks(&looks2), w)

	awaitLooks(t, &looks1, 2, "r1")
	adopter := owner(t, b, "ghost-run")
	if adopter != "r1" && adopter != "r2" {
		t.Fatalf("owner %q, want r1 or r2", adopter)
	}
	adopted := checkResumed(t, b, r2.client, s, "ghost-run", "ghost", adopter)
	if got := adopted.GetResumedTaskIds(); !slices.Equal(got, []string{"t01", "t02"}) {
		t.Errorf("resumed tasks %v, want the unfinished t01 and t02", got)
	}
	got, err := r1.client.GetRun(ctx, &fanoutv1.GetRunRequest{RunId: "ghost-run"})
	if err != nil {
		t.Fatal(err)
	}
	tasks := got.GetRun().GetTasks()
	if len(tasks[0].GetSummary().GetFacts()) != 1 || tasks[0].GetSummary().GetFacts()[0].GetText() != "a fact" {
		t.Errorf("the finished task's outcome was not kept: %v", tasks[0])
	}
	// The dead worker's reservation counts in t01's spend, with the new
	// attempt's (the sweeper posted it at its full 100 tokens).
	if tasks[1].GetTokensSpent() < 100 {
		t.Errorf("t01 spent %d tokens, want the dead attempt's 100 and more", tasks[1].GetTokensSpent())
	}
	// Both replicas keep looking; the ended run stays ended once.
	awaitLooks(t, &looks1, 3, "r1, after the run ended,")
	awaitLooks(t, &looks2, 3, "r2, after the run ended,")
	evs := watchAll(t, r1.client, "ghost-run")
	if n, _ := countFinished(evs); n != 1 || evs[len(evs)-1].GetRunFinished() == nil {
		t.Errorf("%d RunFinished events (last event %T), want 1, last", n, evs[len(evs)-1].GetEvent())
	}
}
