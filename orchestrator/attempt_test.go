package orchestrator_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

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
	fin := checkEvents(t, runStream(t, n.client, spec("flaky", 1, 1_000_000)))
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
