package orchestrator_test

// How an adopted run is resumed (resume.go), case by case: what a lost
// orchestrator left behind — outcomes, a join policy's stop, a deadline, a
// dead worker's reservation — and what the old owner may still do.

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store"
)

// ghost creates a run owned by a dead orchestrator "ghost" (stale
// heartbeat) with its ledger accounts; finished are outcomes already stored.
func ghost(t *testing.T, b *testBundle, runID string, s *fanoutv1.RunSpec, finished ...*fanoutv1.TaskOutcome) budget.RunAccounts {
	t.Helper()
	ctx := t.Context()
	rs := store.NewRuns(b.pool)
	draft := &fanoutv1.Run{RunId: runID, TenantId: "t1", IdempotencyKey: s.GetIdempotencyKey(),
		State: fanoutv1.RunState_RUN_STATE_RUNNING, Spec: s}
	var tb []budget.TaskBudget
	for i, task := range s.GetTasks() {
		draft.Tasks = append(draft.Tasks, &fanoutv1.TaskOutcome{TaskId: task.GetId(), DispatchIndex: int32(i)})
		tb = append(tb, budget.TaskBudget{TaskID: task.GetId(), Limit: task.GetTokenBudget()})
	}
	if _, _, err := rs.CreateRun(ctx, draft, "ghost"); err != nil {
		t.Fatal(err)
	}
	accts, err := b.ledger.OpenRun(ctx, budget.OpenRunParams{RunID: runID, TenantID: "t1",
		Limit: s.GetBudget().GetLimitTokens(), MinReservation: 10, Tasks: tb})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rs.AppendEvent(ctx, runID, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_RunStarted{
		RunStarted: &fanoutv1.RunStarted{Run: draft}}}); err != nil {
		t.Fatal(err)
	}
	for _, o := range finished {
		if _, err := rs.FinishTask(ctx, runID, "ghost", o); err != nil { // and its TaskFinished
			t.Fatal(err)
		}
	}
	return accts
}

// lostAttempt begins an attempt of task on the run of accts, as a dispatch
// of the lost orchestrator did, and returns that attempt's reserve of 100
// tokens by holder with a lease of ttl (its worker's next model call).
func lostAttempt(t *testing.T, b *testBundle, accts budget.RunAccounts, task, holder string,
	ttl time.Duration) func() (budget.Reservation, error) {
	t.Helper()
	run := accts.Run
	attempt, err := b.ledger.BeginAttempt(t.Context(), accts.Tasks[task], run.RunID, run.TenantID)
	if err != nil {
		t.Fatal(err)
	}
	return func() (budget.Reservation, error) {
		return b.ledger.Reserve(t.Context(), budget.ReserveParams{Account: accts.Tasks[task], RunID: run.RunID,
			TenantID: run.TenantID, Attempt: attempt.N, Secret: attempt.Secret, Want: 100, Min: 10, Holder: holder, TTL: ttl})
	}
}

func orphan(t *testing.T, b *testBundle, runID string) {
	t.Helper()
	if _, err := b.pool.Exec(t.Context(), `UPDATE run SET owner_heartbeat = now() - interval '1 hour' WHERE run_id = $1`, runID); err != nil {
		t.Fatal(err)
	}
}

func runState(t *testing.T, b *testBundle, runID string) string {
	t.Helper()
	var st string
	if err := b.pool.QueryRow(t.Context(), `SELECT state FROM run WHERE run_id = $1`, runID).Scan(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// flakyGetRun fails the first GetRun once armed (a transient database error).
type flakyGetRun struct {
	orchestrator.RunStore
	fails *atomic.Int64
}

func (s flakyGetRun) GetRun(ctx context.Context, tenantID, runID string) (*fanoutv1.Run, error) {
	if s.fails.Add(-1) >= 0 {
		return nil, errors.New("test: connection reset")
	}
	return s.RunStore.GetRun(ctx, tenantID, runID)
}

// TestResumeTransientErrorIsRetried: resume's GetRun fails once (a
// transient database error). The adopter forgets the run, so its lease
// lapses and it is adopted again and driven to its end, instead of staying
// RUNNING with a lease renewed by a replica that drives nothing.
func TestResumeTransientErrorIsRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := spec("flaky", 2, 100_000)
	ghost(t, b, "flaky-run", s)
	orphan(t, b, "flaky-run")
	w, _ := b.worker(t, "w", resumeSim, 8)
	var fails atomic.Int64
	fails.Store(1)
	b.orchestratorWith(t, "r", leaseConfig(), func(p *orchestrator.EngineParams) {
		p.Store = flakyGetRun{RunStore: p.Store, fails: &fails}
	}, w)
	deadline := time.Now().Add(15 * time.Second)
	for runState(t, b, "flaky-run") == "RUNNING" {
		if time.Now().After(deadline) {
			var hb time.Duration
			_ = b.pool.QueryRow(t.Context(), `SELECT extract(epoch FROM now() - owner_heartbeat)::float8 * 1e9 FROM run WHERE run_id = 'flaky-run'`).Scan(&hb)
			t.Fatalf("run still RUNNING after 15s, owner %q, heartbeat %v old: adopted, never driven, lease renewed for ever",
				owner(t, b, "flaky-run"), hb)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestResumedFailFastRunFails: a FAIL_FAST run whose task t00 had FAILED
// when its orchestrator died ends FAILED: the adopter replays the kept
// outcomes through the join policy before dispatching anything.
func TestResumedFailFastRunFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := spec("ff", 3, 100_000)
	s.JoinPolicy = fanoutv1.JoinPolicy_JOIN_POLICY_FAIL_FAST
	failed := &fanoutv1.TaskOutcome{TaskId: "t00", Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED,
		Summary: &fanoutv1.FactSummary{Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED, Error: "boom"}}
	ghost(t, b, "ff-run", s, failed)
	orphan(t, b, "ff-run")
	w, _ := b.worker(t, "w", resumeSim, 8)
	r := b.orchestrator(t, "r", leaseConfig(), w)
	fin := checkEvents(t, watchAll(t, r.client, "ff-run"))
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_FAILED {
		var st []string
		for _, o := range fin.GetResult().GetTasks() {
			st = append(st, o.GetTaskId()+"="+o.GetStatus().String())
		}
		t.Errorf("FAIL_FAST run with a FAILED task ended %s (%q); tasks %v", fin.GetState(), fin.GetCancelCause(), st)
	}
}

// TestResumedFirstSuccessRunStops: a FIRST_SUCCESS run whose t00 had
// SUCCEEDED is done: the adopter dispatches nothing more.
func TestResumedFirstSuccessRunStops(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := spec("fs", 3, 100_000)
	s.JoinPolicy = fanoutv1.JoinPolicy_JOIN_POLICY_FIRST_SUCCESS
	ok := &fanoutv1.TaskOutcome{TaskId: "t00", Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED,
		Summary: &fanoutv1.FactSummary{Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED, Facts: []*fanoutv1.Fact{{Text: "a fact"}}}}
	ghost(t, b, "fs-run", s, ok)
	orphan(t, b, "fs-run")
	w, _ := b.worker(t, "w", resumeSim, 8)
	r := b.orchestrator(t, "r", leaseConfig(), w)
	evs := watchAll(t, r.client, "fs-run")
	checkEvents(t, evs)
	for _, ev := range evs {
		if st := ev.GetTaskStarted(); st != nil {
			t.Errorf("task %s dispatched again after the run's first success", st.GetTaskId())
		}
	}
}

// TestOrphanedPastDeadline: the run's timeout passed while it was
// orphaned; t01 had an attempt that reserved 100 tokens (posted by the
// sweeper). The adopter ends it TIMED_OUT, naming the run's timeout, and
// t01's outcome counts the lost attempt's spend although it never ran
// again.
func TestOrphanedPastDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := spec("late", 2, 100_000)
	s.Limits = &fanoutv1.Limits{RunTimeout: durationpb.New(20 * time.Second)}
	accts := ghost(t, b, "late-run", s)
	ctx := t.Context()
	rs := store.NewRuns(b.pool)
	if _, err := rs.StartTask(ctx, "late-run", "ghost", &fanoutv1.TaskStarted{TaskId: "t01", Worker: "dead-worker"}); err != nil {
		t.Fatal(err)
	}
	if _, err := lostAttempt(t, b, accts, "t01", "dead-worker", time.Second)(); err != nil {
		t.Fatal(err)
	}
	sweepCtx, stopSweep := context.WithCancel(ctx)
	swept := make(chan struct{})
	go func() { defer close(swept); budget.Sweep(sweepCtx, b.ledger, 100*time.Millisecond, quietLogger) }()
	defer func() { stopSweep(); await(t, swept, "the sweeper stopping") }()
	if _, err := b.pool.Exec(ctx, `UPDATE run SET created_at = now() - interval '1 minute',
		owner_heartbeat = now() - interval '1 hour' WHERE run_id = 'late-run'`); err != nil {
		t.Fatal(err)
	}
	w, _ := b.worker(t, "w", resumeSim, 8)
	r := b.orchestrator(t, "r", leaseConfig(), w)
	fin := checkEvents(t, watchAll(t, r.client, "late-run"))
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_TIMED_OUT {
		t.Errorf("run ended %s, want TIMED_OUT", fin.GetState())
	}
	if !strings.Contains(fin.GetCancelCause(), "20s") {
		t.Errorf("cause %q, want the run's timeout (20s)", fin.GetCancelCause())
	}
	got, err := r.client.GetRun(ctx, &fanoutv1.GetRunRequest{RunId: "late-run"})
	if err != nil {
		t.Fatal(err)
	}
	if sp := got.GetRun().GetTasks()[1].GetTokensSpent(); sp < 100 {
		t.Errorf("t01 (%s) reports %d tokens spent; its ledger account spent 100 (the lost attempt's)",
			got.GetRun().GetTasks()[1].GetStatus(), sp)
	}
}

// gatedStore pauses the old owner just before it closes a run (its ledger
// run and its end: one write).
type gatedStore struct {
	orchestrator.RunStore
	entered chan struct{}
	gate    chan struct{}
}

func (s gatedStore) CloseRun(ctx context.Context, runID, owner string, epoch int64, state fanoutv1.RunState, cause string,
	result *fanoutv1.JoinedResult) (runs.Closing, error) {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-s.gate
	return s.RunStore.CloseRun(ctx, runID, owner, epoch, state, cause, result)
}

// TestLostOwnerDoesNotCloseAdoptersLedger: a's driver has joined and
// synthesized and is paused just before it ends the ledger run; its
// heartbeats stop; b adopts the run and resumes it (every task had ended:
// b has only the synthesis left). a wakes: its end of the ledger run is
// refused (the run changed hands since a took it), so b's synthesis runs
// and b ends the run.
func TestLostOwnerDoesNotCloseAdoptersLedger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w", resumeSim, 8)
	var paused atomic.Bool
	gs := gatedStore{entered: make(chan struct{}, 1), gate: make(chan struct{})}
	a := b.orchestratorWith(t, "a", leaseConfig(), func(p *orchestrator.EngineParams) {
		gs.RunStore = beatlessStore{RunStore: p.Store, off: &paused}
		p.Store = gs
	}, w)
	other := b.orchestrator(t, "b", leaseConfig(), w)
	s := spec("close", 2, 1_000_000)
	s.Synthesize = true
	start, err := a.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := start.GetRunId()
	await(t, gs.entered, "a reaching CloseRun")
	paused.Store(true) // a is paused: its heartbeats stop reaching the database
	waitOwner(t, b, runID, "b")
	paused.Store(false)
	close(gs.gate) // a wakes up

	fin := checkEvents(t, watchAll(t, other.client, runID))
	if fin.GetResult().GetSynthesis() == "" {
		t.Errorf("adopted run ended %s without its synthesis: %q", fin.GetState(), fin.GetResult().GetSynthesisSkippedReason())
	}
}

// TestSelfAdoptionIsNotCounted: a replica whose own heartbeat lapsed (a
// database blip) re-adopts its own run and drives on; that is not a change
// of hands and does not count toward maxAdoptions.
func TestSelfAdoptionIsNotCounted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := spec("self", 1, 100_000)
	ghost(t, b, "self-run", s)
	orphan(t, b, "self-run")
	rs := store.NewRuns(b.pool)
	a, err := rs.AdoptOrphan(t.Context(), "ghost", time.Second)
	if err != nil || a.RunID != "self-run" {
		t.Fatalf("adopt: %+v, %v", a, err)
	}
	if a.Adoptions != 0 {
		t.Errorf("re-adopting its own run counted %d adoptions", a.Adoptions)
	}
}

// TestShutdownDuringResumeLeavesRun: r adopts an orphan and waits in
// resume for a dead worker's reservation (awaitHeld); r is shut down with
// a deadline that passes meanwhile. r does not start driving the run on a
// cancelled context (which would end it CANCELLED): it leaves the run
// RUNNING for another replica to adopt.
func TestShutdownDuringResumeLeavesRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := spec("sd", 2, 100_000)
	accts := ghost(t, b, "sd-run", s)
	ctx := t.Context()
	// A reservation that nobody settles and no sweeper posts during the test.
	if _, err := lostAttempt(t, b, accts, "t01", "dead-worker", time.Hour)(); err != nil {
		t.Fatal(err)
	}
	orphan(t, b, "sd-run")
	w, _ := b.worker(t, "w", resumeSim, 8)
	cfg := leaseConfig()
	cfg.HeldWait = time.Minute
	reading := make(chan struct{}, 1)
	r := b.orchestratorWith(t, "r", cfg, func(p *orchestrator.EngineParams) {
		p.Ledger = readingLedger{Ledger: p.Ledger, read: reading}
	}, w)
	waitOwner(t, b, "sd-run", "r")
	await(t, reading, "r waiting for the held reservation") // r is in awaitHeld
	sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	_ = r.engine.Shutdown(sctx)
	if st := runState(t, b, "sd-run"); st != "RUNNING" {
		var cause string
		_ = b.pool.QueryRow(ctx, `SELECT coalesce(cancel_cause, '') FROM run WHERE run_id = 'sd-run'`).Scan(&cause)
		t.Errorf("a run adopted by a replica that was shutting down ended %s (%q) instead of being left for another replica", st, cause)
	}
}

// readingLedger tells read each time the run account is read (awaitHeld
// polls it).
type readingLedger struct {
	budget.Ledger
	read chan<- struct{}
}

func (l readingLedger) RunAccount(ctx context.Context, runID string) (budget.Account, error) {
	select {
	case l.read <- struct{}{}:
	default:
	}
	return l.Ledger.RunAccount(ctx, runID)
}

// TestAdoptionFencesTheLostAttempts: a worker of the lost orchestrator
// still holds a reservation on t01 (it is alive, its call goes on). While
// the adopter waits for that reservation to end, the lost attempt can
// reserve no more (its next reserve is denied), and settling what it holds
// is still accepted; then the adopter dispatches t01 again and the run
// succeeds with the two attempts' reservations apart in time.
func TestAdoptionFencesTheLostAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := spec("fence", 2, 100_000)
	accts := ghost(t, b, "fence-run", s)
	ctx := t.Context()
	if _, err := store.NewRuns(b.pool).StartTask(ctx, "fence-run", "ghost", &fanoutv1.TaskStarted{TaskId: "t01", Worker: "old-worker"}); err != nil {
		t.Fatal(err)
	}
	reserve := lostAttempt(t, b, accts, "t01", "old-worker", time.Hour)
	held, err := reserve()
	if err != nil {
		t.Fatal(err)
	}
	orphan(t, b, "fence-run")
	w, _ := b.worker(t, "w", resumeSim, 8)
	reading := make(chan struct{}, 1)
	cfg := leaseConfig()
	cfg.HeldWait = time.Minute
	r := b.orchestratorWith(t, "r", cfg, func(p *orchestrator.EngineParams) {
		p.Ledger = readingLedger{Ledger: p.Ledger, read: reading}
	}, w)
	waitOwner(t, b, "fence-run", "r")
	await(t, reading, "r waiting for the held reservation")

	if again, err := reserve(); !errors.Is(err, budget.ErrDenied) {
		t.Errorf("the lost attempt reserved again while the adopter waited for it: %v, want ErrDenied", err)
		if err == nil { // give it back, so that the adopter goes on
			_, _ = b.ledger.Settle(ctx, budget.SettleParams{Reservation: again.ID, Generation: again.Lease.Generation})
		}
	}
	if _, err := b.ledger.Settle(ctx, budget.SettleParams{Reservation: held.ID, Generation: held.Lease.Generation,
		Actual: 40}); err != nil {
		t.Errorf("the lost attempt could not settle what it held: %v", err)
	}
	checkResumed(t, b, r.client, s, "fence-run", "ghost", "r")
}

// TestOnlyTheOwnerWindsDown: ledger_wind_down is fenced like the run's end:
// an owner whose epoch is not the run's (another replica adopted it since)
// is refused and marks nothing; the owner marks the task accounts it names,
// once, and no other.
func TestOnlyTheOwnerWindsDown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ghost(t, b, "wind-run", spec("wind", 2, 10_000))
	marked := func() (ids []string) {
		rows, err := b.pool.Query(t.Context(), `SELECT task_id FROM account
			WHERE run_id = 'wind-run' AND wind_down ORDER BY task_id`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		return ids
	}
	if err := b.ledger.WindDown(t.Context(), "wind-run", 1, []string{"t00"}); !errors.Is(err, budget.ErrDenied) || marked() != nil {
		t.Fatalf("a stale owner's wind-down: %v, marked %v; want denied, nothing marked", err, marked())
	}
	for range 2 {
		if err := b.ledger.WindDown(t.Context(), "wind-run", 0, []string{"t00"}); err != nil || !slices.Equal(marked(), []string{"t00"}) {
			t.Fatalf("the owner's wind-down of t00: %v, marked %v; want t00 alone", err, marked())
		}
	}
}
