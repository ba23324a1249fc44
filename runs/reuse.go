package runs

import fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"

// Recorded is a task of an earlier run that SUCCEEDED, whose facts a new
// run may reuse instead of running it (docs/budget.md#the-result-cache):
// the store's answer to a cache lookup.
type Recorded struct {
	// ContentKey is the task's content key (the one looked up).
	ContentKey string
	// Outcome is the task's outcome as stored (its run is RunID; its
	// finished_at is set).
	RunID   string
	Outcome *fanoutv1.TaskOutcome
	// Writes counts the task's writes that were sent (or may have been:
	// their outcome is unknown).
	Writes int32
}
