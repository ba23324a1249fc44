// Package runs is the vocabulary that every side of a run shares: the errors
// of the run store's contract and the stored text of run states and task
// statuses. It is a leaf, as River's rivertype is: orchestrator, subagent,
// store and cmd import it, and it imports only the generated protobuf types
// and budget (whose Account it turns into the API's BudgetSnapshot).
//
// Ledger errors are budget's; errors about runs and tasks are these.
package runs

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// Errors of the run store's contract; wrapped errors unwrap to them, so
// callers test with errors.Is.
var (
	// ErrNotFound: no such run or task (or not the caller's tenant's).
	ErrNotFound = errors.New("run not found")
	// ErrWriteNotFound: the database has no record of a tool write by
	// that key (never recorded, or lost by a failover to a standby that
	// lacked it).
	ErrWriteNotFound = errors.New("tool write not found")
	// ErrNoTenant: a read on behalf of a caller named no tenant. Every such
	// read is scoped to one; this is a bug in the calling code.
	ErrNoTenant = errors.New("a tenant is required")
	// ErrEnded: the run or task has already ended, for instance ended by
	// the replica that adopted the run; a terminal outcome is final.
	ErrEnded = errors.New("already ended")
	// ErrNotOwner: another orchestrator drives the run now (it adopted the
	// run while this one's heartbeat lapsed); only the owner writes a run's
	// tasks and its end.
	ErrNotOwner = errors.New("another orchestrator drives the run")
)

// Adoption is a run that an orchestrator took over from a lost one.
type Adoption struct {
	RunID     string
	PrevOwner string
	// Adoptions counts the times the run changed hands, this one included.
	Adoptions int
	// At is when it was adopted, in database time: the clock a run's and
	// its tasks' deadlines count in.
	At time.Time
}

// Head is where a run's event log ends: its newest event's sequence and
// the run's state.
type Head struct {
	Sequence int64
	State    fanoutv1.RunState
}

// Final reports whether the run has ended.
func (h Head) Final() bool {
	return h.State != fanoutv1.RunState_RUN_STATE_RUNNING && h.State != fanoutv1.RunState_RUN_STATE_UNSPECIFIED
}

// Closing is what ending a run with its ledger close (the run store's
// CloseRun) did.
type Closing struct {
	// Run is the run's row as it is now: its state, cause and times, not
	// its tasks.
	Run *fanoutv1.Run
	// Account is the run's closed ledger account; nil for a run without
	// ledger accounts.
	Account *budget.Account
	// Ended reports whether this call ended the run (false: it had ended,
	// or another replica had adopted it, and nothing was written).
	Ended bool
	// Events are the events the call appended, as stored (sequence and
	// time set; what a read of the log returns): the last BudgetUpdate,
	// for a run with an Account, then the RunFinished. None when the call
	// did not end the run, or when a try after a lost reply found the run
	// ended by the lost try.
	Events []*fanoutv1.RunEvent
}

// The stored text of every run state and task status: what run.state and
// task.status hold (their CHECK constraints, run_state_check and
// task_status_check, list the same texts) and what metric attributes, logs
// and the CLI show. Written out rather than derived from the enum names, so
// that renaming or renumbering a value of the API does not change what is
// stored; a new value needs its text here and in the CHECK constraint
// (texts_test.go checks both). The zero values have none: they are never
// stored.
var (
	stateTexts = map[fanoutv1.RunState]string{
		fanoutv1.RunState_RUN_STATE_RUNNING:          "RUNNING",
		fanoutv1.RunState_RUN_STATE_SUCCEEDED:        "SUCCEEDED",
		fanoutv1.RunState_RUN_STATE_FAILED:           "FAILED",
		fanoutv1.RunState_RUN_STATE_CANCELLED:        "CANCELLED",
		fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED: "BUDGET_EXHAUSTED",
		fanoutv1.RunState_RUN_STATE_TIMED_OUT:        "TIMED_OUT",
	}
	statusTexts = map[fanoutv1.TaskStatus]string{
		fanoutv1.TaskStatus_TASK_STATUS_PENDING:          "PENDING",
		fanoutv1.TaskStatus_TASK_STATUS_RUNNING:          "RUNNING",
		fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED:        "SUCCEEDED",
		fanoutv1.TaskStatus_TASK_STATUS_FAILED:           "FAILED",
		fanoutv1.TaskStatus_TASK_STATUS_TIMED_OUT:        "TIMED_OUT",
		fanoutv1.TaskStatus_TASK_STATUS_CANCELLED:        "CANCELLED",
		fanoutv1.TaskStatus_TASK_STATUS_BUDGET_EXHAUSTED: "BUDGET_EXHAUSTED",
		fanoutv1.TaskStatus_TASK_STATUS_ITERATION_LIMIT:  "ITERATION_LIMIT",
		fanoutv1.TaskStatus_TASK_STATUS_SKIPPED:          "SKIPPED",
		fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED:      "NOT_STARTED",
	}
	statesByText   = inverse(stateTexts)
	statusesByText = inverse(statusTexts)
)

func inverse[E comparable](texts map[E]string) map[string]E {
	out := make(map[string]E, len(texts))
	for e, text := range texts {
		if _, dup := out[text]; dup {
			panic("runs: two values stored as " + text)
		}
		out[text] = e
	}
	return out
}

// Text is an enum value's stored text: "SUCCEEDED" for RUN_STATE_SUCCEEDED,
// from the table above for run states and task statuses. Columns, metric
// attributes, logs and the CLI all use it. Any other enum (a join policy in
// a metric attribute), and a state or status with no stored text (the zero
// value, or a number this binary does not know), shows as its name without
// the enum's prefix, or its number: for display only, never stored.
func Text(e protoreflect.Enum) string {
	switch v := e.(type) {
	case fanoutv1.RunState:
		if text, ok := stateTexts[v]; ok {
			return text
		}
	case fanoutv1.TaskStatus:
		if text, ok := statusTexts[v]; ok {
			return text
		}
	}
	v := e.Descriptor().Values().ByNumber(e.Number())
	if v == nil {
		return fmt.Sprint(e.Number())
	}
	return strings.TrimPrefix(string(v.Name()), prefix(e.Descriptor()))
}

// ParseState reads a run state's stored text (case-insensitive).
func ParseState(text string) (fanoutv1.RunState, error) {
	if s, ok := statesByText[strings.ToUpper(text)]; ok {
		return s, nil
	}
	return 0, fmt.Errorf("%q is not a RunState", text)
}

// ParseStatus reads a task status's stored text (case-insensitive).
func ParseStatus(text string) (fanoutv1.TaskStatus, error) {
	if s, ok := statusesByText[strings.ToUpper(text)]; ok {
		return s, nil
	}
	return 0, fmt.Errorf("%q is not a TaskStatus", text)
}

// prefix is the enum's value prefix, "JOIN_POLICY_": buf lint requires the
// zero value to be PREFIX_UNSPECIFIED.
func prefix(d protoreflect.EnumDescriptor) string {
	return strings.TrimSuffix(string(d.Values().ByNumber(0).Name()), "UNSPECIFIED")
}
