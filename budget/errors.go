package budget

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors. Typed errors below unwrap to them, so callers test with errors.Is.
var (
	// ErrExhausted: the budget cannot grant what was asked.
	ErrExhausted = errors.New("budget exhausted")
	// ErrUnavailable: the database stayed unreachable (a restart, a
	// failover or a cut connection) past the store's retries, or the
	// outcome of a write is unknown after one. The work may be tried
	// again; the API answers UNAVAILABLE.
	ErrUnavailable = errors.New("database unavailable")
	// ErrNotFound: no such account or reservation. (An unknown run or task
	// is runs.ErrNotFound.)
	ErrNotFound = errors.New("not found")
	// ErrConflict: the call contradicts what the ledger already recorded.
	ErrConflict = errors.New("conflict")
	// ErrLeaseLost: the reservation's lease expired or belongs to a newer generation.
	ErrLeaseLost = errors.New("lease lost")
	// ErrInvalid: a parameter is out of range.
	ErrInvalid = errors.New("invalid argument")
	// ErrDenied: the caller has no right to spend from the account (another
	// run or tenant, or a superseded attempt).
	ErrDenied = errors.New("reservation denied")
	// ErrResolved: a reserve's key names a reservation that was already
	// settled, voided or expired; it never grants again.
	ErrResolved = errors.New("reservation already resolved")
)

// The causes the ledger records on a run account it exhausts (Account.Cause,
// RunSignal.Cause): the run's own budget ran out, or its tenant's did.
const (
	CauseRunExhausted    = "budget exhausted"
	CauseTenantExhausted = "tenant budget exhausted"
)

// DeniedError says why the ledger refused a reserve its caller had no right to.
type DeniedError struct {
	Account AccountID
	Reason  string
}

func (e *DeniedError) Error() string {
	return fmt.Sprintf("reservation denied on account %d: %s", e.Account, e.Reason)
}

// Is reports whether target is ErrDenied.
func (e *DeniedError) Is(target error) bool { return target == ErrDenied }

// ResolvedError says that a reserve's key names a reservation that is no
// longer held.
type ResolvedError struct {
	Reservation ReservationID
	State       ReservationState
}

func (e *ResolvedError) Error() string {
	return fmt.Sprintf("reservation %d named by the key is %s; it grants nothing again", e.Reservation, e.State)
}

// Is reports whether target is ErrResolved.
func (e *ResolvedError) Is(target error) bool { return target == ErrResolved }

// ExhaustedError says which account could not grant a reservation and why.
type ExhaustedError struct {
	Account   AccountID
	Kind      AccountKind
	State     AccountState // the account's state; StateOpen when it merely lacked tokens
	Requested int64        // the minimum that was needed
	Available int64
}

func (e *ExhaustedError) Error() string {
	if e.State != "" && e.State != StateOpen {
		return fmt.Sprintf("budget exhausted: %s account %d is %s", e.Kind, e.Account, e.State)
	}
	return fmt.Sprintf("budget exhausted: %s account %d has %d tokens available, %d needed",
		e.Kind, e.Account, e.Available, e.Requested)
}

// Is reports whether target is ErrExhausted.
func (e *ExhaustedError) Is(target error) bool { return target == ErrExhausted }

// ConflictError says how a call contradicts the ledger.
type ConflictError struct {
	Reservation ReservationID
	Reason      string
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("conflict on reservation %d: %s", e.Reservation, e.Reason)
}

// Is reports whether target is ErrConflict.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// ValidationError names the parameter (or request field) that is out of
// range and the limit: fanout's one validation error, from the ledger's
// parameters to a RunSpec's fields (ValidationErrors holds several).
type ValidationError struct {
	Field  string // a parameter, or a path from the request: "spec.tasks[3].token_budget"
	Reason string // what is wrong, with the limit it breaks
	// OverCap: the value is well-formed but over a server cap, which the
	// API reports as RESOURCE_EXHAUSTED rather than INVALID_ARGUMENT.
	OverCap bool
}

func (e *ValidationError) Error() string { return e.Field + ": " + e.Reason }

// Is reports whether target is ErrInvalid.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

// ValidationErrors is everything wrong with one request, reported together.
type ValidationErrors []*ValidationError

// MaxReported is how many violations an error names; past it the rest are
// counted ("and 1980 more"), so that one mistake copied over 2,000 tasks
// costs an answer of a few kilobytes, not one line per task.
const MaxReported = 20

// Reported is the violations an error names: the first MaxReported.
func (e ValidationErrors) Reported() ValidationErrors { return e[:min(len(e), MaxReported)] }

func (e ValidationErrors) Error() string {
	shown := e.Reported()
	parts := make([]string, len(shown), len(shown)+1)
	for i, v := range shown {
		parts[i] = v.Error()
	}
	if more := len(e) - len(shown); more > 0 {
		parts = append(parts, fmt.Sprintf("and %d more", more))
	}
	return strings.Join(parts, "; ")
}

// Unwrap returns each ValidationError, so that errors.Is(err, ErrInvalid)
// and errors.As(err, **ValidationError) see them.
func (e ValidationErrors) Unwrap() []error {
	out := make([]error, len(e))
	for i, v := range e {
		out[i] = v
	}
	return out
}

// OverCap reports whether every one of e is over a server cap (and none is
// malformed).
func (e ValidationErrors) OverCap() bool {
	for _, v := range e {
		if !v.OverCap {
			return false
		}
	}
	return len(e) > 0
}

func invalid(field, format string, args ...any) error {
	return &ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Validate checks p before anything is written.
func (p ReserveParams) Validate() error {
	switch {
	case p.Account <= 0:
		return invalid("account", "must be a positive account id, got %d", p.Account)
	case p.RunID == "":
		return invalid("run_id", "must name the run the account belongs to")
	case p.TenantID == "":
		return invalid("tenant_id", "must name the tenant the account belongs to")
	case p.Attempt <= 0:
		return invalid("attempt", "must be >= 1 (the account's current attempt), got %d", p.Attempt)
	case p.Want <= 0:
		return invalid("want", "must be > 0, got %d", p.Want)
	case p.Min <= 0 || p.Min > p.Want:
		return invalid("min", "must be in 1..want (%d), got %d", p.Want, p.Min)
	case p.Holder == "":
		return invalid("holder", "must name the node holding the lease")
	case p.TTL <= 0 || p.TTL > MaxLeaseTTL:
		return invalid("ttl", "must be in (0, %s], got %s", MaxLeaseTTL, p.TTL)
	case len(p.Model) > MaxModelLen:
		return invalid("model", "at most %d bytes, got %d", MaxModelLen, len(p.Model))
	}
	return nil
}

// MaxModelLen bounds a model name on a reservation or an entry.
const MaxModelLen = 256

// MaxLeaseTTL bounds a reservation's lease (and each renewal): the database
// refuses longer ones, so a held reservation cannot keep a run open for long.
const MaxLeaseTTL = time.Hour

// Validate checks p before anything is written.
func (p SettleParams) Validate() error {
	switch {
	case p.Reservation <= 0:
		return invalid("reservation", "must be a positive reservation id, got %d", p.Reservation)
	case p.Actual < 0:
		return invalid("actual", "must be >= 0, got %d", p.Actual)
	case p.InputTokens < 0 || p.OutputTokens < 0:
		return invalid("input_tokens", "input %d and output %d tokens must be >= 0", p.InputTokens, p.OutputTokens)
	case (p.InputTokens != 0 || p.OutputTokens != 0) && p.Estimated:
		return invalid("input_tokens", "an estimated usage has no split, got input %d output %d", p.InputTokens, p.OutputTokens)
	case (p.InputTokens != 0 || p.OutputTokens != 0) && p.InputTokens+p.OutputTokens != p.Actual:
		return invalid("input_tokens", "input %d + output %d must add up to actual %d", p.InputTokens, p.OutputTokens, p.Actual)
	case len(p.Model) > MaxModelLen:
		return invalid("model", "at most %d bytes, got %d", MaxModelLen, len(p.Model))
	}
	return nil
}

// MaxTasksPerRun bounds OpenRunParams.Tasks.
const MaxTasksPerRun = 10_000

// Validate checks p before anything is written.
func (p OpenRunParams) Validate() error {
	switch {
	case p.RunID == "":
		return invalid("run_id", "must not be empty")
	case p.TenantID == "":
		return invalid("tenant_id", "must not be empty")
	case p.Limit <= 0:
		return invalid("limit", "must be > 0, got %d", p.Limit)
	case p.MinReservation <= 0 || p.MinReservation > p.Limit:
		return invalid("min_reservation", "must be in 1..limit (%d), got %d", p.Limit, p.MinReservation)
	case len(p.Tasks) > MaxTasksPerRun:
		return invalid("tasks", "at most %d tasks, got %d", MaxTasksPerRun, len(p.Tasks))
	case p.Held < 0 || p.Held > p.Limit-p.MinReservation:
		return invalid("held", "must be in 0..limit - min_reservation (%d), got %d", p.Limit-p.MinReservation, p.Held)
	case p.Child != nil && p.TenantAccount != 0:
		return invalid("tenant_account", "must be 0 for a child run (its funding is held above it), got %d", p.TenantAccount)
	case p.Child != nil && p.Held != 0:
		return invalid("held", "must be 0 for a child run, got %d", p.Held)
	}
	if c := p.Child; c != nil {
		if err := (OpenChildRunParams{RunID: p.RunID, TenantID: p.TenantID, ParentTask: c.ParentTask, Attempt: c.Attempt,
			Want: p.Limit, Min: c.Min, TTL: c.TTL}).Validate(); err != nil {
			return err
		}
	}
	seen := make(map[string]bool, len(p.Tasks))
	for i, t := range p.Tasks {
		switch {
		case t.TaskID == "":
			return invalid(fmt.Sprintf("tasks[%d].task_id", i), "must not be empty")
		case seen[t.TaskID]:
			return invalid(fmt.Sprintf("tasks[%d].task_id", i), "duplicate task id %q", t.TaskID)
		case t.Limit <= 0:
			return invalid(fmt.Sprintf("tasks[%d].limit", i), "must be > 0, got %d", t.Limit)
		case t.Slice < 0:
			return invalid(fmt.Sprintf("tasks[%d].slice", i), "must be >= 0, got %d", t.Slice)
		}
		seen[t.TaskID] = true
	}
	return nil
}
