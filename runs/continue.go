package runs

import (
	"fmt"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// Continue is a ContinueRun as the store records it
// (docs/budget.md#continue): Add tokens added to run RunID of TenantID
// once per Key, by Actor (key:ID) for Reason. A run that ended
// BUDGET_EXHAUSTED reopens, owned by Owner, for Tasks (each NOT_STARTED or
// SKIPPED), with Held tokens held again for its synthesis. The run's
// limit may not pass MaxLimit.
type Continue struct {
	RunID, TenantID, Key string
	Owner, Actor, Reason string
	Add, Held, MaxLimit  int64
	Tasks                []string
}

// Continued is what a continuation recorded (or, for a Replay, what the
// first call with its key recorded; nothing was written now).
type Continued struct {
	Replay bool
	// Epoch is the run's owner epoch (its adoptions): the fence of the
	// engine that drives a reopened run.
	Epoch int64
	// Event is the RunContinued event as stored; nil for a replay.
	Event *fanoutv1.RunEvent
	// Continuation is the record, as the RunContinued event says it.
	Continuation *fanoutv1.RunContinued
}

// ContinueError is a continuation the ledger refused, with nothing
// written. Outcome is one of ledger_continue_run's: conflict, busy,
// ended, over_cap, too_small, exhausted; or the engine's own: nothing (a
// run that ended with no task to run again), join (its join policy would
// stop it at once).
type ContinueError struct {
	Outcome string
	// State is the run's state (ended) or its account's (busy).
	State string
	// Tokens: for over_cap the most that may be added, for too_small the
	// least that could, for exhausted what the tenant has available.
	Tokens int64
	// Added is what the key first added (conflict).
	Added int64
}

func (e *ContinueError) Error() string {
	switch e.Outcome {
	case "conflict":
		return fmt.Sprintf("the idempotency key was used to add %d tokens, not this amount", e.Added)
	case "busy":
		return fmt.Sprintf("the run is ending (its budget is %s): continue it once it has ended", e.State)
	case "ended":
		return fmt.Sprintf("the run ended %s, and only a run that ended BUDGET_EXHAUSTED (or is running) is continued: fork it instead", e.State)
	case "over_cap":
		return fmt.Sprintf("the run's budget would pass the server's cap: at most %d tokens may be added", e.Tokens)
	case "too_small":
		return fmt.Sprintf("the run could grant nothing with that: add at least %d tokens", e.Tokens)
	case "join":
		return fmt.Sprintf("the run's join policy would stop it at once (%s): fork it to run its tasks again", e.State)
	case "nothing":
		return "every task of the run ended (none is NOT_STARTED): a continuation would run nothing again; fork it to run tasks again"
	case "exhausted":
		return fmt.Sprintf("the tenant's budget is exhausted (%d tokens available)", e.Tokens)
	}
	return "continuation refused: " + e.Outcome
}
