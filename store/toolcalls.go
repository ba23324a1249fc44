package store

import (
	"context"
	"errors"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fanout/fanout/runs"
)

// ErrWriteResolved is returned by ToolCalls.ResolveWrite for a write
// already resolved to another state: a write resolves once.
var ErrWriteResolved = errors.New("tool write already resolved")

// ToolCallsConfig tunes a ToolCalls.
type ToolCallsConfig struct {
	Logger *slog.Logger // default slog.Default()
}

// ToolCalls records tool calls with effect write in the tool_call table
// (TODO: implementation in progress). It implements subagent.WriteLog.
type ToolCalls struct {
	pool *pgxpool.Pool
	cfg  ToolCallsConfig
}

// NewToolCalls returns the tool call log on pool.
func NewToolCalls(pool *pgxpool.Pool, cfg ToolCallsConfig) *ToolCalls {
	return &ToolCalls{pool: pool, cfg: cfg}
}

// IssueWrite records w as issued, before it is sent. Retried after a
// transient error: a second insert of the same key and digest is a no-op;
// the same key with another digest is an error.
func (t *ToolCalls) IssueWrite(ctx context.Context, w runs.Write) error { return errUnimplemented }

// ResolveWrite moves the issued write key to state (done, failed or
// unknown) with its result and error text. Resolving again to the same
// state is a no-op; to another, ErrWriteResolved.
func (t *ToolCalls) ResolveWrite(ctx context.Context, key string, state runs.WriteState, result, errText string) error {
	return errUnimplemented
}

// Writes returns every attempt's writes of a task, oldest first.
func (t *ToolCalls) Writes(ctx context.Context, tenantID, runID, taskID string) ([]runs.Write, error) {
	return nil, errUnimplemented
}
