// Package runs is the vocabulary that every side of a run shares: the errors
// of the run store's contract and the stored text of run states and task
// statuses. It is a leaf, as River's rivertype is: orchestrator, subagent,
// store and cmd import it, and it imports only the generated protobuf types.
//
// Ledger errors are budget's; errors about runs and tasks are these.
package runs

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// Errors of the run store's contract; wrapped errors unwrap to them, so
// callers test with errors.Is.
var (
	// ErrNotFound: no such run or task (or not the caller's tenant's).
	ErrNotFound = errors.New("run not found")
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

// Text is an enum value's stored text: its name without the enum's prefix,
// "SUCCEEDED" for RUN_STATE_SUCCEEDED. Columns, metric attributes, logs and
// the CLI all use it.
func Text(e protoreflect.Enum) string {
	v := e.Descriptor().Values().ByNumber(e.Number())
	if v == nil {
		return fmt.Sprint(e.Number())
	}
	return strings.TrimPrefix(string(v.Name()), prefix(e.Descriptor()))
}

// ParseState reads a run state's stored text (case-insensitive).
func ParseState(text string) (fanoutv1.RunState, error) {
	n, err := parse(fanoutv1.RunState(0).Descriptor(), text)
	return fanoutv1.RunState(n), err
}

// ParseStatus reads a task status's stored text (case-insensitive).
func ParseStatus(text string) (fanoutv1.TaskStatus, error) {
	n, err := parse(fanoutv1.TaskStatus(0).Descriptor(), text)
	return fanoutv1.TaskStatus(n), err
}

func parse(d protoreflect.EnumDescriptor, text string) (protoreflect.EnumNumber, error) {
	v := d.Values().ByName(protoreflect.Name(prefix(d) + strings.ToUpper(text)))
	if v == nil || v.Number() == 0 {
		return 0, fmt.Errorf("%q is not a %s", text, d.Name())
	}
	return v.Number(), nil
}

// prefix is the enum's value prefix, "RUN_STATE_": buf lint requires the
// zero value to be PREFIX_UNSPECIFIED.
func prefix(d protoreflect.EnumDescriptor) string {
	return strings.TrimSuffix(string(d.Values().ByNumber(0).Name()), "UNSPECIFIED")
}
