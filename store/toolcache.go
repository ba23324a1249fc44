package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store/internal/dbsqlc"
)

// ErrToolCacheDenied is returned by ToolCache for a call whose account is
// not of its task and tenant, or whose secret is not the task's current
// attempt's: a worker's login uses the cache of the tenants of the tasks
// dispatched to it only.
var ErrToolCacheDenied = errors.New("tool result cache: not this task's tenant or attempt")

// ToolCache is the tenants' result cache of read tool calls
// (docs/mcp.md#the-result-cache-for-read-tools), in the tool_result_cache table behind
// migrations/functions/tool_cache_get.sql and tool_cache_put.sql. It
// implements subagent.ToolCache. Its calls are not retried: a worker that
// cannot reach the cache calls the tool.
type ToolCache struct {
	db
}

// NewToolCache returns the result cache on pool.
func NewToolCache(pool *Pool, log *slog.Logger) *ToolCache {
	if log == nil {
		log = slog.Default()
	}
	return &ToolCache{db: newDB(pool, log)}
}

// GetToolResult returns the live entry of c in its tenant's cache, or ok
// false: none, or one that expired (database time), which it deletes.
// secret is the task's attempt's; another is ErrToolCacheDenied.
func (t *ToolCache) GetToolResult(ctx context.Context, c runs.CachedCall, secret string) (result json.RawMessage, ok bool, err error) {
	b, err := t.q.GetCachedToolResult(ctx, t.pool, dbsqlc.GetCachedToolResultParams{AccountID: c.Account,
		TenantID: c.TenantID, RunID: c.RunID, TaskID: c.TaskID, Secret: nullable(secret), Server: c.Server,
		Tool: c.Tool, ArgsHash: c.ArgsHash})
	if err != nil {
		return nil, false, fmt.Errorf("get cached result of %s (tenant %s): %w", c.Tool, c.TenantID, cacheErr(err))
	}
	return b, b != nil, nil
}

// PutToolResult stores result (a JSON value) as c's entry in its tenant's
// cache until now() plus ttl (database time; 1ms to runs.MaxCacheTTL),
// replacing an older one. A result over 16 MiB is not stored (stored
// false). secret is the task's attempt's; another is ErrToolCacheDenied.
func (t *ToolCache) PutToolResult(ctx context.Context, c runs.CachedCall, secret string, result json.RawMessage,
	ttl time.Duration) (stored bool, err error) {
	if ttl < runs.MinCacheTTL || ttl > runs.MaxCacheTTL {
		return false, fmt.Errorf("cache result of %s: TTL %s is not %s to %s", c.Tool, ttl, runs.MinCacheTTL, runs.MaxCacheTTL)
	}
	stored, err = t.q.PutCachedToolResult(ctx, t.pool, dbsqlc.PutCachedToolResultParams{AccountID: c.Account,
		TenantID: c.TenantID, RunID: c.RunID, TaskID: c.TaskID, Secret: nullable(secret), Server: c.Server,
		Tool: c.Tool, ArgsHash: c.ArgsHash, Result: result, TtlMs: ttl.Milliseconds()})
	if err != nil {
		return false, fmt.Errorf("cache result of %s (tenant %s): %w", c.Tool, c.TenantID, cacheErr(err))
	}
	return stored, nil
}

// cacheErr makes the functions' refusal (invalid_authorization_specification)
// ErrToolCacheDenied.
func cacheErr(err error) error {
	if isCode(err, "28000") {
		return fmt.Errorf("%w (%w)", ErrToolCacheDenied, err)
	}
	return err
}
