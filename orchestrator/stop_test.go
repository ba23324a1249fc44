package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// Why something stopped is decided in stop.go alone; these tables pin it.

func TestStoppedStatus(t *testing.T) {
	const (
		exhausted = fanoutv1.TaskStatus_TASK_STATUS_BUDGET_EXHAUSTED
		timedOut  = fanoutv1.TaskStatus_TASK_STATUS_TIMED_OUT
		cancelled = fanoutv1.TaskStatus_TASK_STATUS_CANCELLED
		// A task the budget stopped before it started was not cut off:
		// nothing was spent on it.
		notStarted = fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED
	)
	for _, c := range []struct {
		name    string
		cause   error
		started bool
		want    fanoutv1.TaskStatus
	}{
		{"budget exhausted", budget.ErrExhausted, true, exhausted},
		{"budget exhausted, never started", fmt.Errorf("run: %w", budget.ErrExhausted), false, notStarted},
		{"ledger refused: run exhausted", &budget.ExhaustedError{State: budget.StateExhausted}, false, notStarted},
		{"ledger refused: run exhausted, started", &budget.ExhaustedError{State: budget.StateExhausted}, true, exhausted},
		{"ledger refused: run cancelled", &budget.ExhaustedError{State: budget.StateCancelled}, false, cancelled},
		{"ledger refused: run closed", &budget.ExhaustedError{State: budget.StateClosed}, false, cancelled},
		{"task timeout", errTaskTimeout, true, timedOut},
		{"task timeout before start", errTaskTimeout, false, timedOut},
		{"run timeout", errRunTimeout, true, timedOut},
		{"run timeout before start", errRunTimeout, false, cancelled},
		{"cancelled", &CancelError{Cause: "by the caller"}, true, cancelled},
		{"fail fast", &failFastError{taskID: "t1"}, true, cancelled},
		{"first success", errFirstSuccess, false, cancelled},
		{"shutdown", errShutdown, true, cancelled},
		{"context cancelled", context.Canceled, true, cancelled},
	} {
		if got := stoppedStatus(c.cause, c.started); got != c.want {
			t.Errorf("%s: stoppedStatus(%v, started %v) = %s, want %s", c.name, c.cause, c.started, got, c.want)
		}
	}
}

func TestRunState(t *testing.T) {
	p := &plan{spec: &fanoutv1.RunSpec{}, runTimeout: 90e9}
	first := &plan{spec: &fanoutv1.RunSpec{JoinPolicy: fanoutv1.JoinPolicy_JOIN_POLICY_FIRST_SUCCESS}}
	ok := []*fanoutv1.TaskOutcome{{Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED}}
	failed := []*fanoutv1.TaskOutcome{{Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED}}
	for _, c := range []struct {
		name      string
		p         *plan
		cause     error
		exhausted string
		outcomes  []*fanoutv1.TaskOutcome
		want      fanoutv1.RunState
		wantCause string
	}{
		{"every task ended", p, nil, "", ok, fanoutv1.RunState_RUN_STATE_SUCCEEDED, ""},
		{"drained: exhausted without a cause", p, nil, "budget exhausted", ok, fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED, "budget exhausted"},
		{"stopped: exhausted", p, budget.ErrExhausted, "budget exhausted", ok, fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED, "budget exhausted"},
		{"drained: the tenant's budget", p, nil, "tenant budget exhausted", ok, fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED, "tenant budget exhausted"},
		{"stopped: the tenant's budget", p, budget.ErrExhausted, "tenant budget exhausted", ok, fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED, "tenant budget exhausted"},
		{"cancelled", p, &CancelError{Cause: "by ops"}, "", ok, fanoutv1.RunState_RUN_STATE_CANCELLED, "by ops"},
		{"cancelled after exhaustion", p, &CancelError{Cause: "by ops"}, "budget exhausted", ok, fanoutv1.RunState_RUN_STATE_CANCELLED, "by ops"},
		{"run timeout", p, errRunTimeout, "", ok, fanoutv1.RunState_RUN_STATE_TIMED_OUT, "run timed out after 1m30s"},
		{"shutdown", p, errShutdown, "", ok, fanoutv1.RunState_RUN_STATE_CANCELLED, errShutdown.Error()},
		{"fail fast", p, &failFastError{taskID: "t1", status: fanoutv1.TaskStatus_TASK_STATUS_FAILED, reason: "boom"}, "", failed,
			fanoutv1.RunState_RUN_STATE_FAILED, "task t1 ended FAILED: boom"},
		{"first success", first, errFirstSuccess, "", ok, fanoutv1.RunState_RUN_STATE_SUCCEEDED, ""},
		{"first success: none", first, nil, "", failed, fanoutv1.RunState_RUN_STATE_FAILED, "no task succeeded (join policy FIRST_SUCCESS)"},
		{"lost", p, errRunLost, "", ok, fanoutv1.RunState_RUN_STATE_FAILED, errRunLost.Error()},
		{"other", p, errors.New("boom"), "", ok, fanoutv1.RunState_RUN_STATE_FAILED, "boom"},
	} {
		got, cause := runState(c.p, c.cause, c.exhausted, c.outcomes)
		if got != c.want || cause != c.wantCause {
			t.Errorf("%s: runState = %s %q, want %s %q", c.name, got, cause, c.want, c.wantCause)
		}
	}
}
