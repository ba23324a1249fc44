package orchestrator_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/llm"
)

// flakyBegin fails the first BeginAttempt as a dropped connection would.
type flakyBegin struct {
	budget.Ledger
	n atomic.Int32
}

func (f *flakyBegin) BeginAttempt(ctx context.Context, a budget.AccountID, run, tenant string) (budget.Attempt, error) {
	if f.n.Add(1) == 1 {
		return budget.Attempt{}, errors.New("read tcp: connection reset by peer")
	}
	return f.Ledger.BeginAttempt(ctx, a, run, tenant)
}

// TestDispatchRetriesATransientAttemptError: a database error while the
// dispatch is recorded is retried, not a failed task; its text never
// reaches the caller.
func TestDispatchRetriesATransientAttemptError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w1", llm.SimConfig{}, 8)
	flaky := &flakyBegin{}
	n := b.orchestratorWith(t, "o1", orchestrator.Config{}, func(p *orchestrator.EngineParams) {
		flaky.Ledger = p.Ledger
		p.Ledger = flaky
	}, w)
	// Two tasks, one at a time: the first's attempt is begun with the run,
	// the second's by its dispatch, which hits the error.
	s := spec("flaky", 2, 1_000_000)
	s.Limits = &fanoutv1.Limits{MaxConcurrency: 1}
	fin := checkEvents(t, runStream(t, n.client, s))
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Errorf("run ended %s (%s), want SUCCEEDED after the retried attempt", fin.GetState(), fin.GetCancelCause())
	}
	for _, o := range fin.GetResult().GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			t.Errorf("task %s: %s %q, want SUCCEEDED", o.GetTaskId(), o.GetStatus(), o.GetSummary().GetError())
		}
	}
	if got := flaky.n.Load(); got < 2 {
		t.Errorf("BeginAttempt called %d times, want the failed call retried", got)
	}
}

// countingBegin counts BeginAttempt calls.
type countingBegin struct {
	budget.Ledger
	n atomic.Int32
}

func (c *countingBegin) BeginAttempt(ctx context.Context, a budget.AccountID, run, tenant string) (budget.Attempt, error) {
	c.n.Add(1)
	return c.Ledger.BeginAttempt(ctx, a, run, tenant)
}

// TestFirstAttemptsBegunWithTheRun: the tasks that can start when a run is
// created (its first wave, up to its concurrency) have their first attempt
// begun in the write that creates the run; only the others, dispatched
// later, begin one each. Every task reserves with the attempt it was given.
func TestFirstAttemptsBegunWithTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w1", llm.SimConfig{}, 8)
	counting := &countingBegin{}
	n := b.orchestratorWith(t, "o1", orchestrator.Config{}, func(p *orchestrator.EngineParams) {
		counting.Ledger = p.Ledger
		p.Ledger = counting
	}, w)
	s := spec("begun", 5, 1_000_000)
	s.Limits = &fanoutv1.Limits{MaxConcurrency: 3}
	fin := checkEvents(t, runStream(t, n.client, s))
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("run ended %s (%s), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	for _, o := range fin.GetResult().GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED || o.GetTokensSpent() == 0 {
			t.Errorf("task %s: %s, %d tokens (%q), want SUCCEEDED with spend", o.GetTaskId(), o.GetStatus(),
				o.GetTokensSpent(), o.GetSummary().GetError())
		}
	}
	if got := counting.n.Load(); got != 2 {
		t.Errorf("BeginAttempt called %d times, want 2: the 3 tasks of the first wave began theirs with the run", got)
	}
	var attempts []int64
	if err := b.pool.QueryRow(t.Context(), `SELECT array_agg(attempt ORDER BY task_id) FROM account
		WHERE run_id = (SELECT run_id FROM run WHERE idempotency_key = 'begun') AND kind = 'task'`).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if len(attempts) != 5 {
		t.Fatalf("task accounts' attempts %v, want 5", attempts)
	}
	for i, a := range attempts {
		if a != 1 {
			t.Errorf("task %d's account is at attempt %d, want 1 (one dispatch each)", i, a)
		}
	}
	b.checkLedger(t)
}

// TestHeldTaskAsksTheLedgerOnceTheRunStopped: a first-wave task that waits
// for its tenant's only task slot while the run is exhausted under DRAIN
// does not use the attempt begun with the run when the slot frees: its
// dispatch asks the ledger, which refuses, and the task ends NOT_STARTED
// without reaching a worker (no TaskStarted, no model call).
func TestHeldTaskAsksTheLedgerOnceTheRunStopped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, sim := b.worker(t, "w", llm.SimConfig{Latency: 2 * time.Second}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w)
	b.setQuotas(t, nil, nil, 1)
	s := spec("held", 2, 100_000)
	s.OnExhaustion = fanoutv1.ExhaustionPolicy_EXHAUSTION_POLICY_DRAIN
	s.Limits = &fanoutv1.Limits{MaxConcurrency: 2}
	start, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(patience)
	for len(sim.Calls()) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no model call started within %v", patience)
		}
		time.Sleep(10 * time.Millisecond) // polling the sim's call log
	}
	exhaust(t, b, start.GetRunId(), s.GetTenantId())
	evs := watchAll(t, n.client, start.GetRunId())
	fin := checkEvents(t, evs)
	var held *fanoutv1.TaskOutcome
	for _, o := range fin.GetResult().GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			held = o
		}
	}
	if held == nil || held.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED || held.GetWorker() != "" {
		t.Fatalf("tasks %v: want one SUCCEEDED and the held one NOT_STARTED on no worker", fin.GetResult().GetTasks())
	}
	for _, ev := range evs {
		if ev.GetTaskStarted().GetTaskId() == held.GetTaskId() {
			t.Errorf("event %d starts %s, which the ledger refused", ev.GetSequence(), held.GetTaskId())
		}
	}
	if calls := len(sim.Calls()); calls != 1 {
		t.Errorf("%d model calls, want 1", calls)
	}
}
