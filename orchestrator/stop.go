package orchestrator

// Why a run or a task stopped, and what status that is: every cause of a
// run context and every mapping from a cause to a RunState or TaskStatus
// is here, so that the drive loop, the dispatcher, synthesis and adoption
// all answer the question the same way.

import (
	"context"
	"errors"
	"fmt"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// Cancel causes of a run context, read with context.Cause. Budget exhaustion
// is budget.ErrExhausted; a cancelled run's cause is a *CancelError.
var (
	errRunTimeout   = errors.New("run timed out")
	errTaskTimeout  = errors.New("task timed out")
	errFirstSuccess = errors.New("a task succeeded (join policy FIRST_SUCCESS)")
	errShutdown     = errors.New("orchestrator shut down before the run ended")
	// errRunLost: another replica adopted the run while this one's
	// heartbeat lapsed.
	errRunLost = errors.New("another orchestrator adopted the run while this one's heartbeat lapsed")
)

// CancelError is the cause of a run cancelled through CancelRun (on any
// replica), by the caller of Run going away, or by shutdown. It is
// budget.ErrRunCancelled.
type CancelError struct{ Cause string }

func (e *CancelError) Error() string { return e.Cause }

// Is reports whether target is budget.ErrRunCancelled.
func (e *CancelError) Is(target error) bool { return target == budget.ErrRunCancelled }

// failFastError is the cause of a run ended by JOIN_POLICY_FAIL_FAST.
type failFastError struct {
	taskID string
	status fanoutv1.TaskStatus
	reason string
}

func (e *failFastError) Error() string {
	s := fmt.Sprintf("task %s ended %s", e.taskID, runs.Text(e.status))
	if e.reason != "" {
		s += ": " + e.reason
	}
	return s
}

// runState is how a run ends, given the cause of its context (nil when
// every task ended by itself), why its budget was exhausted if it was (the
// ledger said so, also under DRAIN, which cancels nothing; "" if not) and
// its tasks' outcomes.
func runState(p *plan, cause error, exhausted string, outcomes []*fanoutv1.TaskOutcome) (fanoutv1.RunState, string) {
	var ff *failFastError
	var ce *CancelError
	switch {
	case cause == nil || errors.Is(cause, errFirstSuccess) || errors.Is(cause, context.Canceled):
		if exhausted != "" {
			return fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED, exhausted
		}
		if p.spec.GetJoinPolicy() == fanoutv1.JoinPolicy_JOIN_POLICY_FIRST_SUCCESS {
			for _, o := range outcomes {
				if o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
					return fanoutv1.RunState_RUN_STATE_SUCCEEDED, ""
				}
			}
			return fanoutv1.RunState_RUN_STATE_FAILED, "no task succeeded (join policy FIRST_SUCCESS)"
		}
		return fanoutv1.RunState_RUN_STATE_SUCCEEDED, ""
	case errors.Is(cause, budget.ErrExhausted):
		return fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED, cmpOr(exhausted, budget.ErrExhausted.Error())
	case errors.As(cause, &ff):
		return fanoutv1.RunState_RUN_STATE_FAILED, ff.Error()
	case errors.As(cause, &ce):
		return fanoutv1.RunState_RUN_STATE_CANCELLED, ce.Cause
	case errors.Is(cause, errRunTimeout):
		return fanoutv1.RunState_RUN_STATE_TIMED_OUT, fmt.Sprintf("run timed out after %s", p.runTimeout)
	case errors.Is(cause, errShutdown):
		return fanoutv1.RunState_RUN_STATE_CANCELLED, errShutdown.Error()
	default:
		return fanoutv1.RunState_RUN_STATE_FAILED, cause.Error()
	}
}

// stoppedStatus is the status of a task stopped by cause before it ended
// by itself. started says whether a worker had started it: a task that
// never started did not time out because its run did (it was cancelled),
// and was not cut off by the budget (it is NOT_STARTED: nothing was spent
// on it). A ledger refusal (*budget.ExhaustedError) is BUDGET_EXHAUSTED
// only when the run's budget was; a cancelled or closed run cancels the
// task.
func stoppedStatus(cause error, started bool) fanoutv1.TaskStatus {
	var ex *budget.ExhaustedError
	exhausted := fanoutv1.TaskStatus_TASK_STATUS_BUDGET_EXHAUSTED
	if !started {
		exhausted = fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED
	}
	switch {
	case errors.As(cause, &ex):
		if ex.State == budget.StateExhausted {
			return exhausted
		}
		return fanoutv1.TaskStatus_TASK_STATUS_CANCELLED
	case errors.Is(cause, budget.ErrExhausted):
		return exhausted
	case errors.Is(cause, errTaskTimeout), started && errors.Is(cause, errRunTimeout):
		return fanoutv1.TaskStatus_TASK_STATUS_TIMED_OUT
	default:
		return fanoutv1.TaskStatus_TASK_STATUS_CANCELLED
	}
}

// unstarted is the outcome of a task that never ran, stopped by cause. It
// has no summary (nothing ran), except when the budget stopped it: a
// NOT_STARTED task says why.
func unstarted(cause error) *fanoutv1.TaskOutcome {
	st := stoppedStatus(cause, false)
	o := &fanoutv1.TaskOutcome{Status: st}
	if st == fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED {
		o.Summary = &fanoutv1.FactSummary{Status: st,
			Error: fmt.Sprintf("not started: the run's budget ran out before it could start (%v)", cause)}
	}
	return o
}

// workerHears reports whether a worker learns of cause by itself (through
// the ledger or its own deadline), so that it can be given CancelGrace to
// send its summary before the call is cut.
func workerHears(cause error) bool {
	return errors.Is(cause, budget.ErrExhausted) || errors.Is(cause, budget.ErrRunCancelled) ||
		errors.Is(cause, errTaskTimeout) || errors.Is(cause, errRunTimeout)
}

// terminalStatus reports whether a worker's summary status ends a task.
func terminalStatus(st fanoutv1.TaskStatus) bool {
	switch st {
	case fanoutv1.TaskStatus_TASK_STATUS_UNSPECIFIED, fanoutv1.TaskStatus_TASK_STATUS_PENDING,
		fanoutv1.TaskStatus_TASK_STATUS_RUNNING, fanoutv1.TaskStatus_TASK_STATUS_SKIPPED:
		return false
	}
	return true
}

// cancelReason is a low-cardinality class of a run's cancel cause.
func cancelReason(cause error) string {
	var ff *failFastError
	switch {
	case errors.Is(cause, budget.ErrExhausted):
		return "budget_exhausted"
	case errors.Is(cause, errShutdown):
		return "shutdown"
	case errors.Is(cause, budget.ErrRunCancelled):
		return "run_cancelled"
	case errors.Is(cause, errRunTimeout), errors.Is(cause, errTaskTimeout):
		return "timeout"
	case errors.Is(cause, errFirstSuccess):
		return "first_success"
	case errors.As(cause, &ff):
		return "fail_fast"
	default:
		return "other"
	}
}
