package subagent

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/fanout/fanout/runs"
)

// ToolCache is the tenants' result cache of read tools
// (docs/mcp.md#the-result-cache-for-read-tools); store.ToolCache implements it. secret
// is the task's attempt's (Task.AttemptSecret): the database answers only
// for the tenant of a task dispatched with it.
type ToolCache interface {
	// GetToolResult returns the live entry of c, or ok false.
	GetToolResult(ctx context.Context, c runs.CachedCall, secret string) (result json.RawMessage, ok bool, err error)
	// PutToolResult stores result as c's entry for ttl (database time);
	// stored false: it was too big to keep.
	PutToolResult(ctx context.Context, c runs.CachedCall, secret string, result json.RawMessage, ttl time.Duration) (stored bool, err error)
}

// MaxToolResultBytes caps a tool result's text (an MCP server's
// max_result_bytes may not exceed it: mcp.MaxMaxResultBytes) and a result
// cache entry: a read's result bigger than this, encoded, is not cached.
const MaxToolResultBytes = 16 << 20

// cacheTimeout bounds one lookup or store in the cache: the tool is called
// (or its result given to the model) without it rather than later.
const cacheTimeout = 5 * time.Second

// cacheWarnEvery is how often a worker logs that its cache cannot be used.
const cacheWarnEvery = time.Minute

// The results of fanout.tool_cache.lookups.
const (
	cacheHit   = "hit"
	cacheMiss  = "miss"
	cacheError = "error"
)

// cachedResult is a result as the cache keeps it.
type cachedResult struct {
	Text    string   `json:"text"`
	Sources []string `json:"sources,omitempty"`
}

// cacheable reports whether call c of tool may be answered from, and
// stored in, the tenant's result cache: the run opted in
// (Task.CacheTools), the tool's policy gives it a TTL, and it is a read.
// The effect is checked here as well as where the policy is read: a server
// that marks a read tool destructive after start makes it a write, and a
// write is never answered from the cache.
func (r *taskAttempt) cacheable(tool Tool) bool {
	return r.task.CacheTools && r.ToolCache != nil && tool.CacheTTL > 0 && tool.Effect == EffectRead
}

// cachedCall is the cache's key of call c of tool for this task.
func (r *taskAttempt) cachedCall(tool Tool, args json.RawMessage) runs.CachedCall {
	return runs.CachedCall{Account: int64(r.task.Account), TenantID: r.task.TenantID, RunID: r.task.RunID,
		TaskID: r.task.TaskID, Server: tool.Server, Tool: tool.Name, ArgsHash: argsDigest(args)}
}

// fromCache returns the live cached result of call c of tool, if any. An
// error of the cache is a miss (logged, at most once a cacheWarnEvery):
// the tool is called.
func (r *taskAttempt) fromCache(ctx context.Context, tool Tool, c runs.CachedCall) (ToolResult, bool) {
	cctx, cancel := context.WithTimeout(ctx, cacheTimeout)
	defer cancel()
	b, ok, err := r.ToolCache.GetToolResult(cctx, c, r.task.AttemptSecret)
	var res cachedResult
	if err == nil && ok {
		err = json.Unmarshal(b, &res)
	}
	result := cacheMiss
	switch {
	case err != nil:
		result, ok = cacheError, false
		r.warnCache(ctx, "read tool result cache unusable: calling the tool", tool, err)
	case ok:
		result = cacheHit
	}
	metrics().toolCacheLookups.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(attrCacheResult.String(result)))
	return ToolResult{Text: res.Text, Sources: res.Sources}, ok
}

// toCache stores what a read call returned, if it succeeded and is not
// too big; an error of the cache is logged, not the call's.
func (r *taskAttempt) toCache(ctx context.Context, tool Tool, c runs.CachedCall, o toolOutcome) {
	if !o.ran || o.notRun != "" || o.err != nil || o.res.IsError || ctx.Err() != nil {
		return
	}
	b, err := json.Marshal(cachedResult{Text: o.res.Text, Sources: o.res.Sources})
	if err != nil || len(b) > MaxToolResultBytes {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, cacheTimeout)
	defer cancel()
	if _, err := r.ToolCache.PutToolResult(cctx, c, r.task.AttemptSecret, b, tool.CacheTTL); err != nil {
		r.warnCache(ctx, "read tool result cache unusable: the result is not cached", tool, err)
	}
}

// warnCache logs a cache error, at most once a cacheWarnEvery per Loop.
func (r *taskAttempt) warnCache(ctx context.Context, msg string, tool Tool, err error) {
	if r.cacheWarn.due(time.Now()) {
		r.Logger.WarnContext(ctx, msg, "tool", tool.Name, "run_id", r.task.RunID, "task_id", r.task.TaskID, "err", err)
	}
}

// every says yes at most once an interval.
type every struct {
	interval time.Duration
	mu       sync.Mutex
	last     time.Time
}

func (e *every) due(now time.Time) bool {
	if e == nil {
		return true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.last.IsZero() && now.Sub(e.last) < e.interval {
		return false
	}
	e.last = now
	return true
}
