package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store/internal/dbsqlc"
)

// ErrWriteResolved is returned by ToolCalls.ResolveWrite for a write
// already resolved to another state, and by IssueWrite for a key whose
// write was already resolved: a write resolves once, and is never issued
// again.
var ErrWriteResolved = errors.New("tool write already resolved")

// ErrWriteConflict is returned by ToolCalls.IssueWrite for a key already
// issued for another call (other arguments, tool, task or attempt): the
// key must name one call.
var ErrWriteConflict = errors.New("tool write key names another call")

// ErrWriteNotFound is returned by ToolCalls.ResolveWrite and WriteStatus
// for a key the database has no record of (runs.ErrWriteNotFound).
var ErrWriteNotFound = runs.ErrWriteNotFound

// MaxWriteTextBytes bounds a write's stored result and error text each;
// longer ones are cut at a character boundary and marked.
const MaxWriteTextBytes = 1 << 20

// truncatedMark ends a result or error cut at MaxWriteTextBytes.
const truncatedMark = " …[truncated]"

// ToolCallsConfig tunes a ToolCalls.
type ToolCallsConfig struct {
	Logger *slog.Logger // default slog.Default()
}

// ToolCalls records tool calls with effect write in the tool_call table
// (migrations/functions/tool_call_issue.sql): issued before the call is sent, resolved once after.
// The database holds the rule too: an update of a row can only move it
// from issued to another state, once, and nodes cannot delete one. It
// implements subagent.WriteLog.
//
// Every call is retried after a transient database error (retry.go): a
// retried issue finds its own row by key and digest, a retried resolution
// finds the state it set.
type ToolCalls struct {
	db
}

// NewToolCalls returns the tool call log on pool tuned by cfg (at most
// one; none: the zero ToolCallsConfig). A node has two (Stores.Writes on
// the ledger pool, Stores.Approvals on the API pool).
func NewToolCalls(pool *Pool, config ...ToolCallsConfig) *ToolCalls {
	cfg := configOf(config)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &ToolCalls{db: newDB(pool, cfg.Logger)}
}

var digestRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// checkWrite validates what IssueWrite stores; the database checks it too.
func checkWrite(w runs.Write) error {
	for _, f := range []struct {
		name, v string
		max     int
	}{
		{"Key", w.Key, 256}, {"TenantID", w.TenantID, 128}, {"RunID", w.RunID, 256},
		{"TaskID", w.TaskID, 64}, {"Tool", w.Tool, 256},
	} {
		switch {
		case f.v == "":
			return fmt.Errorf("%s is empty", f.name)
		case len(f.v) > f.max:
			return fmt.Errorf("%s is %d bytes, more than %d", f.name, len(f.v), f.max)
		}
	}
	switch {
	case len(w.Server) > 256:
		return fmt.Errorf("%s is %d bytes, more than 256", "Server", len(w.Server))
	case w.Attempt < 1:
		return fmt.Errorf("%s is %d: must be at least 1", "Attempt", w.Attempt)
	case w.Iteration < 0 || w.Iteration > 1<<31-1:
		return fmt.Errorf("%s is %d: must be 0 to %d", "Iteration", w.Iteration, 1<<31-1)
	case w.Index < 0 || w.Index > 1<<31-1:
		return fmt.Errorf("%s is %d: must be 0 to %d", "Index", w.Index, 1<<31-1)
	case !digestRE.MatchString(w.ArgsDigest):
		return fmt.Errorf("%s %q is not a hex SHA-256 (64 lowercase hex digits)", "ArgsDigest", w.ArgsDigest)
	case len(w.Preview) > runs.MaxPreviewBytes || !utf8.ValidString(w.Preview) || strings.ContainsRune(w.Preview, 0):
		return fmt.Errorf("%s is %d bytes: must be valid UTF-8 without NUL, at most %d", "Preview", len(w.Preview), runs.MaxPreviewBytes)
	}
	return nil
}

// IssueWrite records w before it is sent and returns the row as stored:
// state issued (send it), or awaiting_approval when the run's recorded
// policy says a person must approve the tool's writes (then the row has
// its CallID and ApprovalDeadline: wait for the decision, WriteStatus,
// and send it with SendWrite once approved). Retried after a transient
// error: a second insert of the same key and digest finds the row; the
// same key with another digest (or another tool, task or attempt) is
// ErrWriteConflict; a key whose write was already resolved is
// ErrWriteResolved (it must not be sent again), with the row. Only w's
// identity and preview are stored: its state, result, error and times are
// the database's. secret is the attempt's (budget.Attempt.Secret), which a
// worker's login must present: another, or none, is ErrWriteConflict, as
// is a tool the run's recorded policy does not name.
func (t *ToolCalls) IssueWrite(ctx context.Context, w runs.Write, secret string) (runs.Write, error) {
	if err := checkWrite(w); err != nil {
		return runs.Write{}, fmt.Errorf("issue tool write %s: %w", w.Key, err)
	}
	var got runs.Write
	err := retried(ctx, t.log, "toolcalls.issue", idempotent, func(ctx context.Context, _ try) error {
		// The insert, fenced by the task account's current attempt
		// (migration 0016); then the row as it is (ours, if an earlier try
		// committed).
		outcome, err := t.q.IssueToolCall(ctx, t.pool, dbsqlc.IssueToolCallParams{AccountID: w.Account, Key: w.Key,
			TenantID: w.TenantID, RunID: w.RunID, TaskID: w.TaskID, Attempt: w.Attempt, Iteration: int32(w.Iteration),
			CallIndex: int32(w.Index), Server: w.Server, Tool: w.Tool, ArgsDigest: w.ArgsDigest, Preview: w.Preview,
			Secret: nullable(secret)})
		if err != nil {
			return err
		}
		switch outcome {
		case "superseded":
			return fmt.Errorf("attempt %d is no longer the current attempt of account %d: %w", w.Attempt, w.Account, runs.ErrAttemptSuperseded)
		case "denied":
			return fmt.Errorf("account %d is not task %s of run %s (tenant %s), attempt %d of it was not dispatched with this secret, "+
				"or the run's tool policy does not name %s: %w", w.Account, w.TaskID, w.RunID, w.TenantID, w.Attempt, w.Tool, ErrWriteConflict)
		}
		got, err = t.identity(ctx, w.Key)
		return err
	})
	if err != nil {
		return runs.Write{}, fmt.Errorf("issue tool write %s (%s, task %s of run %s): %w", w.Key, w.Tool, w.TaskID, w.RunID, err)
	}
	if diff := sameCall(got, w); diff != "" {
		return runs.Write{}, fmt.Errorf("issue tool write %s (%s, task %s of run %s): the key was issued with another %s: %w",
			w.Key, w.Tool, w.TaskID, w.RunID, diff, ErrWriteConflict)
	}
	switch got.State {
	case runs.WriteIssued, runs.WriteAwaitingApproval, runs.WriteApproved:
		return got, nil
	}
	return got, fmt.Errorf("issue tool write %s (%s, task %s of run %s): it is %s since %s: %w",
		w.Key, w.Tool, w.TaskID, w.RunID, got.State, got.ResolvedAt.Format(time.RFC3339Nano), ErrWriteResolved)
}

// identity reads the row of key: which call it is and where it stands (a
// worker's login reads no result and no preview).
func (t *ToolCalls) identity(ctx context.Context, key string) (runs.Write, error) {
	r, err := t.q.ToolCallIdentity(ctx, t.pool, key)
	return writeOf(dbsqlc.ToolCallWritesRow{Key: r.Key, TenantID: r.TenantID, RunID: r.RunID, TaskID: r.TaskID,
		Attempt: r.Attempt, Iteration: r.Iteration, CallIndex: r.CallIndex, Server: r.Server, Tool: r.Tool,
		ArgsDigest: r.ArgsDigest, State: r.State, CreatedAt: r.CreatedAt, ResolvedAt: r.ResolvedAt, CallID: r.CallID,
		ApprovalDeadline: r.ApprovalDeadline}), err
}

// SendWrite moves the approved write w (its Key, Account, TenantID, RunID,
// TaskID and Attempt: the task's current attempt, which may be later than
// the one that asked for the approval) to issued, just before it is sent;
// the write then resolves with secret, that attempt's. sent says to send
// it (also for a retry that finds it sent by this attempt); otherwise
// state is what keeps it from being sent (awaiting_approval, denied, or
// issued by another attempt, ...). runs.ErrAttemptSuperseded when the
// attempt is no longer the task's; ErrWriteConflict for another task's
// call or the wrong secret. The database refuses the move unless an
// approval of the call is recorded.
func (t *ToolCalls) SendWrite(ctx context.Context, w runs.Write, secret string) (sent bool, state runs.WriteState, err error) {
	var outcome string
	err = retried(ctx, t.log, "toolcalls.send", idempotent, func(ctx context.Context, _ try) (err error) {
		outcome, err = t.q.SendToolCall(ctx, t.pool, dbsqlc.SendToolCallParams{AccountID: w.Account, Key: w.Key,
			TenantID: w.TenantID, RunID: w.RunID, TaskID: w.TaskID, Attempt: w.Attempt, Secret: nullable(secret)})
		return err
	})
	switch {
	case err != nil:
		return false, "", fmt.Errorf("send approved tool write %s: %w", w.Key, err)
	case outcome == "sent":
		return true, runs.WriteIssued, nil
	case outcome == "superseded":
		return false, "", fmt.Errorf("send approved tool write %s: attempt %d is no longer the task's: %w", w.Key, w.Attempt, runs.ErrAttemptSuperseded)
	case outcome == "forbidden":
		return false, "", fmt.Errorf("send approved tool write %s: not task %s's call, or not attempt %d's secret: %w",
			w.Key, w.TaskID, w.Attempt, ErrWriteConflict)
	}
	return false, runs.WriteState(outcome), nil
}

// WriteStatus returns where the write key stands, for a worker waiting
// for its approval: its state, why it was denied, and whether its approval
// deadline has passed (the database's clock). secret is the task's current
// attempt's, which a worker's login must present.
func (t *ToolCalls) WriteStatus(ctx context.Context, key, secret string) (runs.WriteStatus, error) {
	var state, errText *string
	var expired bool
	err := retried(ctx, t.log, "toolcalls.status", idempotent, func(ctx context.Context, _ try) error {
		return t.pool.QueryRow(ctx, `SELECT state, error, expired FROM tool_call_status($1, $2)`, key, nullable(secret)).
			Scan(&state, &errText, &expired)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows), err == nil && state == nil: // tool_call_status returns no row for no such key
		return runs.WriteStatus{}, fmt.Errorf("tool write %s: %w", key, ErrWriteNotFound)
	case err != nil:
		return runs.WriteStatus{}, fmt.Errorf("tool write %s: %w", key, err)
	}
	return runs.WriteStatus{State: runs.WriteState(*state), Error: deref(errText), Expired: expired}, nil
}

// ExpireWrite denies the write key, which waits for approval, as expired
// if its deadline has passed by the database's clock, and returns its
// state after. secret is the task's current attempt's.
func (t *ToolCalls) ExpireWrite(ctx context.Context, key, secret string) (runs.WriteState, error) {
	var state *string
	err := retried(ctx, t.log, "toolcalls.expire", idempotent, func(ctx context.Context, _ try) error {
		return t.pool.QueryRow(ctx, `SELECT tool_call_expire($1, $2)`, key, nullable(secret)).Scan(&state)
	})
	switch {
	case err != nil:
		return "", fmt.Errorf("expire tool write %s: %w", key, err)
	case state == nil:
		return "", fmt.Errorf("expire tool write %s: %w", key, ErrWriteNotFound)
	}
	return runs.WriteState(*state), nil
}

// sameCall names the first field in which a stored write differs from w,
// or returns "".
func sameCall(got, w runs.Write) string {
	switch {
	case got.ArgsDigest != w.ArgsDigest:
		return "arguments digest"
	case got.Tool != w.Tool || got.Server != w.Server:
		return "tool"
	case got.TenantID != w.TenantID || got.RunID != w.RunID || got.TaskID != w.TaskID:
		return "task"
	case got.Attempt != w.Attempt:
		return "attempt"
	case got.Iteration != w.Iteration || got.Index != w.Index:
		return "place in the reply"
	}
	return ""
}

// writeOf maps a tool_call row to the runs package's type; a worker's
// login reads no result or error (they stay empty).
func writeOf(r dbsqlc.ToolCallWritesRow) runs.Write {
	w := runs.Write{Key: r.Key, TenantID: r.TenantID, RunID: r.RunID, TaskID: r.TaskID, Attempt: r.Attempt,
		Iteration: int(r.Iteration), Index: int(r.CallIndex), Server: r.Server, Tool: r.Tool, ArgsDigest: r.ArgsDigest,
		State: runs.WriteState(r.State), CreatedAt: r.CreatedAt, Result: r.Result, Error: r.Error, CallID: deref(r.CallID),
		Preview: r.Preview}
	if r.ResolvedAt != nil {
		w.ResolvedAt = *r.ResolvedAt
	}
	if r.ApprovalDeadline != nil {
		w.ApprovalDeadline = *r.ApprovalDeadline
	}
	return w
}

// storedText makes s storable as PostgreSQL text: valid UTF-8, no NUL
// bytes, at most MaxWriteTextBytes (cut at a character boundary, marked).
func storedText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if len(s) <= MaxWriteTextBytes {
		return s
	}
	cut := MaxWriteTextBytes - len(truncatedMark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + truncatedMark
}

// ResolveWrite moves the issued write key to state (done, failed,
// unknown or not_sent) with its result and error text. Resolving again to the same
// state is a no-op (the first result stands); to another,
// ErrWriteResolved; a key never issued, ErrWriteNotFound. Text that is not
// valid UTF-8 or holds NUL bytes is stored with U+FFFD in their place, and
// cut at MaxWriteTextBytes. secret is the one the write was issued with;
// another, from a worker's login, is ErrWriteConflict.
func (t *ToolCalls) ResolveWrite(ctx context.Context, key, secret string, state runs.WriteState, result, errText string) error {
	switch state {
	case runs.WriteDone, runs.WriteFailed, runs.WriteUnknown, runs.WriteNotSent:
	default:
		return fmt.Errorf("resolve tool write %s: state %q: must be %s, %s, %s or %s", key, state,
			runs.WriteDone, runs.WriteFailed, runs.WriteUnknown, runs.WriteNotSent)
	}
	if key == "" {
		return errors.New("resolve tool write: key is empty")
	}
	result, errText = storedText(result), storedText(errText)
	var resolved bool
	var got *string
	err := retried(ctx, t.log, "toolcalls.resolve", idempotent, func(ctx context.Context, _ try) error {
		// On a retry, the state an earlier committed try set.
		return t.pool.QueryRow(ctx, `SELECT resolved, state FROM tool_call_resolve($1, $2, $3, $4, $5)`,
			key, string(state), result, errText, nullable(secret)).Scan(&resolved, &got)
	})
	switch {
	case err != nil:
		return fmt.Errorf("resolve tool write %s as %s: %w", key, state, err)
	case resolved:
		return nil
	case got == nil:
		return fmt.Errorf("resolve tool write %s as %s: %w", key, state, ErrWriteNotFound)
	case *got == "denied":
		return fmt.Errorf("resolve tool write %s as %s: it was not issued with this secret: %w", key, state, ErrWriteConflict)
	case runs.WriteState(*got) == state:
		return nil
	}
	return fmt.Errorf("resolve tool write %s as %s: it is %s: %w", key, state, *got, ErrWriteResolved)
}

// Writes returns every attempt's writes of a task, oldest first (by the
// database's time of issue, then attempt, iteration and place in the
// reply). secret is the task's current attempt's, which a worker's login
// must present.
func (t *ToolCalls) Writes(ctx context.Context, tenantID, runID, taskID, secret string) ([]runs.Write, error) {
	switch {
	case tenantID == "":
		return nil, errors.New("list tool writes: tenant id is empty")
	case runID == "" || taskID == "":
		return nil, fmt.Errorf("list tool writes of tenant %s: run id %q and task id %q must not be empty", tenantID, runID, taskID)
	}
	var out []runs.Write
	err := retried(ctx, t.log, "toolcalls.writes", idempotent, func(ctx context.Context, _ try) error {
		rows, err := t.q.ToolCallWrites(ctx, t.pool, dbsqlc.ToolCallWritesParams{TenantID: tenantID, RunID: runID,
			TaskID: taskID, Secret: nullable(secret)})
		out = make([]runs.Write, len(rows))
		for i, r := range rows {
			out[i] = writeOf(r)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list tool writes of task %s of run %s: %w", taskID, runID, err)
	}
	return out, nil
}

// DefaultPendingPage and MaxPendingPage bound a page of PendingWrites.
const (
	DefaultPendingPage = 50
	MaxPendingPage     = 200
)

// PendingWrites returns up to limit of the tenant's writes that wait for
// approval (of run runID, or of every run when it is ""), oldest first,
// after the cursor (afterCreated, afterCallID; zero for the first page).
func (t *ToolCalls) PendingWrites(ctx context.Context, tenantID, runID string, afterCreated time.Time, afterCallID string,
	limit int) ([]runs.Write, error) {
	if tenantID == "" {
		return nil, errors.New("list pending tool writes: tenant id is empty")
	}
	limit = min(max(limit, 1), MaxPendingPage+1) // a page and one more, to know there is a next
	var out []runs.Write
	err := retried(ctx, t.log, "toolcalls.pending", idempotent, func(ctx context.Context, _ try) error {
		rows, err := t.q.PendingToolCalls(ctx, t.pool, dbsqlc.PendingToolCallsParams{TenantID: tenantID, RunID: runID,
			AfterCreated: afterCreated, AfterCallID: afterCallID, MaxRows: int32(limit)})
		out = make([]runs.Write, len(rows))
		for i, r := range rows {
			out[i] = writeOf(dbsqlc.ToolCallWritesRow{Key: r.Key, TenantID: r.TenantID, RunID: r.RunID, TaskID: r.TaskID,
				Attempt: r.Attempt, Iteration: r.Iteration, CallIndex: r.CallIndex, Server: r.Server, Tool: r.Tool,
				ArgsDigest: r.ArgsDigest, State: r.State, CreatedAt: r.CreatedAt, ResolvedAt: r.ResolvedAt,
				CallID: r.CallID, Preview: r.Preview, ApprovalDeadline: r.ApprovalDeadline})
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list pending tool writes of tenant %s: %w", tenantID, err)
	}
	return out, nil
}

// Decide records actor's decision on the tenant's write callID, which
// waits for approval, with reason (at most 1,024 bytes), and returns it
// with the call's state after. The same decision again returns the one
// recorded (idempotent). runs.ErrNotFound for a call the tenant does not
// have; runs.ErrDecisionConflict (with the recorded decision) when it was
// decided otherwise; runs.ErrApprovalExpired when its deadline passed
// first (it is denied now); runs.ErrNotAwaitingApproval for a call that
// never waited for one. Only an orchestrator's login may decide, under an
// actor the database trusts: "anonymous", "role:" and the session's login,
// or a key with its secret (DecideAs); any other is refused (SQLSTATE
// 42501) and nothing is recorded. The owner is not asked.
func (t *ToolCalls) Decide(ctx context.Context, tenantID, callID string, approve bool, actor, reason string) (runs.Decision, error) {
	return t.DecideAs(ctx, tenantID, callID, approve, actor, "", reason)
}

// DecideAs is Decide for an actor "key:ID" whose caller presented the key's
// secret: the database records the decision under the key only if the key
// is a live approve key of the tenant whose digest the secret matches
// (presentActorSecret). The secret is in no error.
func (t *ToolCalls) DecideAs(ctx context.Context, tenantID, callID string, approve bool, actor, secret, reason string) (runs.Decision, error) {
	switch {
	case tenantID == "":
		return runs.Decision{}, errors.New("decide tool write: tenant id is empty")
	case len(reason) > 1024:
		return runs.Decision{}, fmt.Errorf("decide tool write %s: reason is %d bytes, more than 1024", callID, len(reason))
	}
	decision := "denied"
	if approve {
		decision = "approved"
	}
	reason = storedText(reason)
	var r decideRow
	err := retried(ctx, t.log, "toolcalls.decide", idempotent, func(ctx context.Context, _ try) error {
		// A retry after a commit whose reply was lost finds the decision
		// it made: "same". (sqlc does not know a RETURNS TABLE's columns.)
		return pgx.BeginFunc(ctx, t.pool, func(tx pgx.Tx) error {
			if err := presentActorSecret(ctx, t.q, tx, secret); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT outcome, decision, actor, reason, decided_at, run_id, task_id, tool, state
				FROM tool_call_decide($1, $2, $3, $4, $5)`, tenantID, callID, decision, actor, reason).Scan(
				&r.Outcome, &r.Decision, &r.Actor, &r.Reason, &r.DecidedAt, &r.RunID, &r.TaskID, &r.Tool, &r.State)
		})
	})
	if err != nil {
		return runs.Decision{}, fmt.Errorf("decide tool write %s: %w", callID, err)
	}
	d := runs.Decision{CallID: callID, RunID: deref(r.RunID), TaskID: deref(r.TaskID), Tool: deref(r.Tool),
		Approved: deref(r.Decision) == "approved", Reason: deref(r.Reason), Actor: deref(r.Actor),
		State: runs.WriteState(deref(r.State))}
	if r.DecidedAt != nil {
		d.DecidedAt = *r.DecidedAt
	}
	switch deref(r.Outcome) {
	case "decided":
		d.Recorded = true
		return d, nil
	case "same":
		return d, nil
	case "not_found":
		return d, fmt.Errorf("decide tool write %s of tenant %s: %w", callID, tenantID, runs.ErrNotFound)
	case "conflict":
		return d, fmt.Errorf("decide tool write %s: it was %s by %s at %s: %w", callID, deref(r.Decision), d.Actor,
			d.DecidedAt.Format(time.RFC3339), runs.ErrDecisionConflict)
	case "expired":
		return d, fmt.Errorf("decide tool write %s: its deadline passed: %w", callID, runs.ErrApprovalExpired)
	case "run_ended":
		return d, fmt.Errorf("decide tool write %s: its run ended: %w", callID, runs.ErrDecisionConflict)
	case "not_waiting":
		return d, fmt.Errorf("decide tool write %s: it is %s: %w", callID, d.State, runs.ErrNotAwaitingApproval)
	}
	return d, fmt.Errorf("decide tool write %s: unexpected outcome %q", callID, deref(r.Outcome))
}

// decideRow is a row of tool_call_decide.
type decideRow struct {
	Outcome, Decision, Actor, Reason, RunID, TaskID, Tool, State *string
	DecidedAt                                                    *time.Time
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// MaxRunWritesPage is the most writes RunWrites returns at once.
const MaxRunWritesPage = 200

// RunWrites returns up to limit of the writes of the tenant's run runID,
// oldest first, after the cursor (afterCreated, afterCallID), with the
// decision on each: what ListToolCalls serves. The results are not read
// (content); their sizes are. Another tenant's run has none.
func (t *ToolCalls) RunWrites(ctx context.Context, tenantID, runID string, afterCreated time.Time, afterCallID string,
	limit int) ([]runs.LoggedWrite, error) {
	if tenantID == "" || runID == "" {
		return nil, errors.New("list a run's tool writes: tenant id or run id is empty")
	}
	limit = min(max(limit, 1), MaxRunWritesPage+1) // a page and one more, to know there is a next
	var out []runs.LoggedWrite
	err := retried(ctx, t.log, "toolcalls.run", idempotent, func(ctx context.Context, _ try) error {
		// sqlc cannot name the nullable columns of the left join.
		rows, err := t.pool.Query(ctx, `
			SELECT c.key, c.task_id, c.attempt, c.iteration, c.call_index, c.server, c.tool, c.args_digest, c.state,
			       c.error, coalesce(c.result_bytes, 0), c.created_at, c.resolved_at, c.call_id, c.preview,
			       c.approval_deadline, d.decision, d.reason, d.actor, d.decided_at
			  FROM tool_call c
			  LEFT JOIN tool_call_decision d ON d.call_id = c.call_id
			 WHERE c.tenant_id = $1 AND c.run_id = $2 AND (c.created_at, c.call_id) > ($3::timestamptz, $4::text)
			 ORDER BY c.created_at, c.call_id
			 LIMIT $5`, tenantID, runID, afterCreated, afterCallID, limit)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (runs.LoggedWrite, error) {
			w := runs.LoggedWrite{Write: runs.Write{TenantID: tenantID, RunID: runID}}
			var state string
			var resolved, deadline, decidedAt *time.Time
			var decision, reason, actor *string
			err := r.Scan(&w.Key, &w.TaskID, &w.Attempt, &w.Iteration, &w.Index, &w.Server, &w.Tool, &w.ArgsDigest,
				&state, &w.Error, &w.ResultBytes, &w.CreatedAt, &resolved, &w.CallID, &w.Preview, &deadline,
				&decision, &reason, &actor, &decidedAt)
			w.State = runs.WriteState(state)
			if resolved != nil {
				w.ResolvedAt = *resolved
			}
			if deadline != nil {
				w.ApprovalDeadline = *deadline
			}
			if decision != nil {
				w.Decision = &runs.Decision{CallID: w.CallID, RunID: runID, TaskID: w.TaskID, Tool: w.Tool,
					Approved: *decision == "approved", Reason: deref(reason), Actor: deref(actor), State: w.State}
				if decidedAt != nil {
					w.Decision.DecidedAt = *decidedAt
				}
			}
			return w, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list the tool writes of run %s: %w", runID, err)
	}
	return out, nil
}
