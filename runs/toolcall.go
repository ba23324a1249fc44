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
// issued before it is sent and resolved once.
type WriteState string

// The write states.
const (
	WriteIssued  WriteState = "issued"   // recorded; sent or about to be
	WriteDone    WriteState = "done"     // the tool reported success
	WriteFailed  WriteState = "failed"   // the tool reported failure
	WriteUnknown WriteState = "unknown"  // cut off (cancelled, timed out, connection lost): may have happened
	WriteNotSent WriteState = "not_sent" // never reached the tool (refused, over a cap, a rate wait ended): a later attempt may make it
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
	ResolvedAt time.Time // zero while issued
}
