package store

import (
	"context"
	"fmt"
	"time"

	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store/internal/dbsqlc"
)

// CachedTasks returns, of each of keys, tenantID's newest task that
// SUCCEEDED with that content key no longer than maxAge ago (database
// time), with its sent writes: the result cache's lookup
// (docs/budget.md#the-result-cache). Only the tenant's own tasks are read,
// and only tasks that ran (a task that reused another's facts has no key).
func (s *Runs) CachedTasks(ctx context.Context, tenantID string, keys []string, maxAge time.Duration) ([]runs.Recorded, error) {
	rows, err := retry(ctx, s.log, "runs.cached_tasks", idempotent, func(ctx context.Context, _ try) ([]dbsqlc.CachedTasksRow, error) {
		return s.q.CachedTasks(ctx, s.pool, dbsqlc.CachedTasksParams{TenantID: tenantID, ContentKeys: keys, MaxAge: maxAge})
	})
	if err != nil {
		return nil, fmt.Errorf("look up the cached tasks of tenant %s: %w", tenantID, err)
	}
	out := make([]runs.Recorded, 0, len(rows))
	for _, r := range rows {
		t := r.FinishedAt
		o, err := taskRow{RunID: r.RunID, TaskID: r.TaskID, Status: "SUCCEEDED", Outcome: r.Outcome,
			TokensSpent: r.TokensSpent, FinishedAt: &t}.outcome()
		if err != nil {
			return nil, err
		}
		o.DispatchIndex = 0 // the source's; meaningless to the new run
		out = append(out, runs.Recorded{ContentKey: r.ContentKey, RunID: r.RunID, Outcome: o, Writes: r.Writes})
	}
	return out, nil
}

// SentWrites returns how many writes each task of tenantID's run runID
// sent (or may have: their outcome is unknown), by task id; a task
// without any is left out.
func (s *Runs) SentWrites(ctx context.Context, tenantID, runID string) (map[string]int32, error) {
	rows, err := retry(ctx, s.log, "runs.sent_writes", idempotent, func(ctx context.Context, _ try) ([]dbsqlc.SentWritesRow, error) {
		return s.q.SentWrites(ctx, s.pool, dbsqlc.SentWritesParams{TenantID: tenantID, RunID: runID})
	})
	if err != nil {
		return nil, fmt.Errorf("count the sent writes of run %s: %w", runID, err)
	}
	out := make(map[string]int32, len(rows))
	for _, r := range rows {
		out[r.TaskID] = r.Writes
	}
	return out, nil
}
