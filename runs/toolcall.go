package runs

import (
	"errors"
	"time"
)

// ErrAttemptSuperseded says the task's attempt that asked is no longer its
// current one (the orchestrator dispatched it again): a write it would
// issue is refused before it is sent.
var ErrAttemptSuperseded = errors.New("attempt superseded")

// WriteState is where a tool call with effect write is. A write is recorded
// before it is sent (issued, or awaiting_approval when its run's policy
// says a person must approve it) and resolved once. The transitions, which
// the database holds (migrations/versioned/0028_approvals.sql):
//
//	(recorded)        -> issued | awaiting_approval
//	awaiting_approval -> approved | denied
//	approved          -> issued | denied
//	issued            -> done | failed | unknown | not_sent
type WriteState string

// The write states.
const (
	WriteAwaitingApproval WriteState = "awaiting_approval" // recorded; waits for a decision (ApproveToolCall, DenyToolCall)
	WriteApproved         WriteState = "approved"          // approved; not sent yet
	WriteDenied           WriteState = "denied"            // denied, expired, or its run ended first: never sent
	WriteIssued           WriteState = "issued"            // recorded; sent or about to be
	WriteDone             WriteState = "done"              // the tool reported success
	WriteFailed           WriteState = "failed"            // the tool reported failure
	WriteUnknown          WriteState = "unknown"           // cut off (cancelled, timed out, connection lost): may have happened
	WriteNotSent          WriteState = "not_sent"          // never reached the tool (refused, over a cap, a rate wait ended): a later attempt may make it
)

// Write is one tool call with effect write, as the tool_call table keeps it.
type Write struct {
	Key string // the idempotency key sent in the call's _meta; unique
	// Account is the ledger account the attempt runs on (the task's; the
	// run's for synthesis): a write is issued only while Attempt is that
	// account's current attempt. Not stored in the row.
	Account    int64
	TenantID   string
	RunID      string
	TaskID     string
	Attempt    int64
	Iteration  int
	Index      int    // the call's place in the model's reply
	Server     string // the MCP server's configured name; "" for a built-in tool
	Tool       string // the model-facing name (server__tool for MCP tools)
	ArgsDigest string // hex SHA-256 of the call's JSON arguments as the model sent them
	State      WriteState
	Result     string // a done or failed write's result as the model was shown it
	Error      string // why a write failed or is unknown
	CreatedAt  time.Time
	ResolvedAt time.Time // zero while issued, awaiting approval or approved

	// CallID is the call's id in the API (ApproveToolCall): the database's.
	CallID string
	// Preview is what an approver sees of the arguments: at most
	// MaxPreviewBytes, secret-looking values redacted.
	Preview string
	// ApprovalDeadline is when a call awaiting approval is denied as
	// expired; zero for a call that needs none.
	ApprovalDeadline time.Time
}

// The error texts of a write denied by fanout itself
// (migrations/functions/tool_call_decide.sql, tool_call_expire.sql,
// tool_call_end_run.sql); a person's denial reads "denied by key:ID:
// reason".
const (
	DeniedExpired  = "denied: the approval expired"
	DeniedRunEnded = "denied: run ended"
)

// MaxPreviewBytes bounds Write.Preview.
const MaxPreviewBytes = 1024

// WriteStatus is where a recorded write stands now, as a worker waiting
// for its approval polls it.
type WriteStatus struct {
	State WriteState
	Error string // why it was denied
	// Expired: the call still awaits approval, and its deadline has
	// passed by the database's clock.
	Expired bool
}

// ToolPolicy is a run's policy for one tool its tasks may call, recorded
// with the run: whether its writes wait for a person's approval, and for
// how long before they are denied.
type ToolPolicy struct {
	Tool            string // the model-facing name
	Approval        bool
	ApprovalTimeout time.Duration // > 0 when Approval
}

// Decision is a person's (or, for an expiry or a run's end, fanout's)
// decision on a write that waited for approval.
type Decision struct {
	CallID    string
	RunID     string
	TaskID    string
	Tool      string
	Approved  bool
	Reason    string
	Actor     string // key:ID, role:NAME, anonymous, or fanout
	DecidedAt time.Time
	// State is the call's state after the decision.
	State WriteState
	// Recorded: this call recorded the decision (not a repeat of one
	// already recorded).
	Recorded bool
}

// The ways a decision can fail (store.ToolCalls.Decide).
var (
	// ErrDecisionConflict: the call was already decided the other way (or
	// expired, or its run ended).
	ErrDecisionConflict = errors.New("the call was already decided otherwise")
	// ErrNotAwaitingApproval: the call never waited for approval.
	ErrNotAwaitingApproval = errors.New("the call does not wait for approval")
	// ErrApprovalExpired: the call's deadline passed before the decision;
	// it is denied.
	ErrApprovalExpired = errors.New("the approval expired")
)

// LoggedWrite is a write as the API lists it (ListToolCalls): the row
// without its result, which is content, and the decision on it, if any.
type LoggedWrite struct {
	Write
	// ResultBytes is the size of the result the model was shown.
	ResultBytes int64
	// Decision is the approval or denial of the call; nil if none was taken.
	Decision *Decision
}
