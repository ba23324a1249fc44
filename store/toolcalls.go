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

	"github.com/jackc/pgx/v5/pgxpool"

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

// ErrWriteNotFound is returned by ToolCalls.ResolveWrite for a key that was
// never issued.
var ErrWriteNotFound = errors.New("tool write not found")

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

// NewToolCalls returns the tool call log on pool.
func NewToolCalls(pool *pgxpool.Pool, cfg ToolCallsConfig) *ToolCalls {
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
	}
	return nil
}

// IssueWrite records w as issued, before it is sent. Retried after a
// transient error: a second insert of the same key and digest is a no-op;
// the same key with another digest (or another tool, task or attempt) is
// ErrWriteConflict; a key whose write was already resolved is
// ErrWriteResolved (it must not be sent again). Only w's identity is
// stored: its state, result, error and times are the database's. secret
// is the attempt's (budget.Attempt.Secret), which a worker's login must
// present: another, or none, is ErrWriteConflict.
func (t *ToolCalls) IssueWrite(ctx context.Context, w runs.Write, secret string) error {
	if err := checkWrite(w); err != nil {
		return fmt.Errorf("issue tool write %s: %w", w.Key, err)
	}
	var got runs.Write
	err := retried(ctx, t.log, "toolcalls.issue", idempotent, func(ctx context.Context, _ try) error {
		// The insert, fenced by the task account's current attempt
		// (migration 0016); then the row as it is (ours, if an earlier try
		// committed).
		outcome, err := t.q.IssueToolCall(ctx, t.pool, dbsqlc.IssueToolCallParams{AccountID: w.Account, Key: w.Key,
			TenantID: w.TenantID, RunID: w.RunID, TaskID: w.TaskID, Attempt: w.Attempt, Iteration: int32(w.Iteration),
			CallIndex: int32(w.Index), Server: w.Server, Tool: w.Tool, ArgsDigest: w.ArgsDigest, Secret: nullable(secret)})
		if err != nil {
			return err
		}
		switch outcome {
		case "superseded":
			return fmt.Errorf("attempt %d is no longer the current attempt of account %d: %w", w.Attempt, w.Account, runs.ErrAttemptSuperseded)
		case "denied":
			return fmt.Errorf("account %d is not task %s of run %s (tenant %s), or attempt %d of it was not dispatched with this secret: %w",
				w.Account, w.TaskID, w.RunID, w.TenantID, w.Attempt, ErrWriteConflict)
		}
		// The row's identity and state (a worker's login reads no result).
		r, err := t.q.ToolCallIdentity(ctx, t.pool, w.Key)
		got = writeOf(dbsqlc.ToolCallWritesRow{Key: r.Key, TenantID: r.TenantID, RunID: r.RunID, TaskID: r.TaskID,
			Attempt: r.Attempt, Iteration: r.Iteration, CallIndex: r.CallIndex, Server: r.Server, Tool: r.Tool,
			ArgsDigest: r.ArgsDigest, State: r.State, CreatedAt: r.CreatedAt, ResolvedAt: r.ResolvedAt})
		return err
	})
	if err != nil {
		return fmt.Errorf("issue tool write %s (%s, task %s of run %s): %w", w.Key, w.Tool, w.TaskID, w.RunID, err)
	}
	if diff := sameCall(got, w); diff != "" {
		return fmt.Errorf("issue tool write %s (%s, task %s of run %s): the key was issued with another %s: %w",
			w.Key, w.Tool, w.TaskID, w.RunID, diff, ErrWriteConflict)
	}
	if got.State != runs.WriteIssued {
		return fmt.Errorf("issue tool write %s (%s, task %s of run %s): it is %s since %s: %w",
			w.Key, w.Tool, w.TaskID, w.RunID, got.State, got.ResolvedAt.Format(time.RFC3339Nano), ErrWriteResolved)
	}
	return nil
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
		State: runs.WriteState(r.State), CreatedAt: r.CreatedAt, Result: r.Result, Error: r.Error}
	if r.ResolvedAt != nil {
		w.ResolvedAt = *r.ResolvedAt
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
