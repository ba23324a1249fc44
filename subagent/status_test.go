package subagent

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// TestStopStatus checks the worker's one mapping from why the loop stopped
// (its error and its context's cause) to the task's status.
func TestStopStatus(t *testing.T) {
	t.Parallel()
	refused := func(kind budget.AccountKind, state budget.AccountState) error {
		return fmt.Errorf("reserve 100 tokens for iteration 2: %w", &budget.ExhaustedError{Kind: kind, State: state})
	}
	heard := func(sig budget.RunSignal) error { // as endedErr says it
		return fmt.Errorf("%w (%s): %w", errRunEnded, sig.State, sig.Err())
	}
	lease := fmt.Errorf("renew lease of reservation 7: %w", budget.ErrLeaseLost)
	for _, tc := range []struct {
		name       string
		err, cause error
		want       Status
	}{
		{"ledger: run cancelled", refused(budget.KindRun, budget.StateCancelled), nil, StatusCancelled},
		{"ledger: run closed", refused(budget.KindRun, budget.StateClosed), nil, StatusCancelled},
		{"ledger: tenant closed", refused(budget.KindTenant, budget.StateClosed), nil, StatusCancelled},
		{"ledger: run exhausted", refused(budget.KindRun, budget.StateExhausted), nil, StatusBudgetExhausted},
		{"ledger: task out of tokens", refused(budget.KindTask, budget.StateOpen), nil, StatusBudgetExhausted},
		{"watcher: exhausted", heard(budget.RunSignal{State: budget.StateExhausted}), nil, StatusBudgetExhausted},
		{"watcher: cancelled", heard(budget.RunSignal{State: budget.StateCancelled}), nil, StatusCancelled},
		{"cancel: exhausted", budget.ErrExhausted, budget.ErrExhausted, StatusBudgetExhausted},
		{"cancel: run cancelled", budget.ErrRunCancelled, budget.ErrRunCancelled, StatusCancelled},
		{"cancel: deadline", context.DeadlineExceeded, context.DeadlineExceeded, StatusTimedOut},
		{"deadline mid-call", errors.New("call model sim: stream reset"), context.DeadlineExceeded, StatusTimedOut},
		{"cancel: shutting down", ErrShuttingDown, ErrShuttingDown, StatusCancelled},
		{"cancel: lease lost", lease, lease, StatusFailed},
		{"lease lost mid-call", lease, nil, StatusFailed},
		{"iteration limit", fmt.Errorf("run 3 iterations: %w", ErrIterationLimit), nil, StatusIterationLimit},
		{"model error", errors.New("call model sim in iteration 1: HTTP 400"), nil, StatusFailed},
		{"settle failed after a cancel", errors.New("settle reservation 3 with 10 tokens: conflict"), ErrShuttingDown, StatusFailed},
	} {
		if got := stopStatus(tc.err, tc.cause); got != tc.want {
			t.Errorf("%s: stopStatus(%v, %v) = %s, want %s", tc.name, tc.err, tc.cause, got, tc.want)
		}
	}
}

// TestStatusTextIsTheEnumsText checks that every terminal Status is the
// stored text of its fanout.v1.TaskStatus (runs.Text), and that every
// terminal TaskStatus has one.
func TestStatusTextIsTheEnumsText(t *testing.T) {
	t.Parallel()
	all := []Status{StatusSucceeded, StatusFailed, StatusTimedOut, StatusCancelled, StatusBudgetExhausted, StatusIterationLimit}
	have := map[fanoutv1.TaskStatus]bool{}
	for _, st := range all {
		v := st.Proto()
		if runs.Text(v) != string(st) {
			t.Errorf("status %s is sent as %s", st, v)
		}
		have[v] = true
	}
	notTerminal := map[fanoutv1.TaskStatus]bool{fanoutv1.TaskStatus_TASK_STATUS_UNSPECIFIED: true,
		fanoutv1.TaskStatus_TASK_STATUS_PENDING: true, fanoutv1.TaskStatus_TASK_STATUS_RUNNING: true,
		// SKIPPED and NOT_STARTED: the orchestrator's, for a task never dispatched
		fanoutv1.TaskStatus_TASK_STATUS_SKIPPED: true, fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED: true}
	values := fanoutv1.TaskStatus(0).Descriptor().Values()
	for i := range values.Len() {
		v := fanoutv1.TaskStatus(values.Get(i).Number())
		if !notTerminal[v] && !have[v] {
			t.Errorf("%s has no subagent.Status", v)
		}
	}
	if got := Status("NO_SUCH_STATUS").Proto(); got != fanoutv1.TaskStatus_TASK_STATUS_FAILED {
		t.Errorf("an unknown status is sent as %s, want FAILED", got)
	}
}
