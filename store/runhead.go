package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/runs"
)

// Head returns where the run's event log ends and its state, in one read
// of the run row that leaves its spec and result on disk: what a WatchRun
// stream needs to start (issue 12: each stream read the whole run).
// Returns runs.ErrNotFound if the tenant has no such run, runs.ErrNoTenant
// for an empty tenantID. A read: tried again after any transient error,
// so that a stream started during a failover waits it out.
func (s *Runs) Head(ctx context.Context, tenantID, runID string) (runs.Head, error) {
	if tenantID == "" {
		return runs.Head{}, fmt.Errorf("read the head of run %s: %w", runID, runs.ErrNoTenant)
	}
	var seq int64
	var state string
	err := retried(ctx, s.log, "runs.head", idempotent, func(ctx context.Context, _ try) error {
		return s.pool.QueryRow(ctx, `SELECT last_sequence, state FROM run
			WHERE run_id = $1 AND tenant_id = $2`, runID, tenantID).Scan(&seq, &state)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return runs.Head{}, fmt.Errorf("run %s: %w", runID, runs.ErrNotFound)
	}
	if err != nil {
		return runs.Head{}, fmt.Errorf("read the head of run %s: %w", runID, err)
	}
	st, err := runs.ParseState(state)
	if err != nil {
		return runs.Head{}, fmt.Errorf("run %s: stored state: %w", runID, err)
	}
	return runs.Head{Sequence: seq, State: st}, nil
}

// Heads returns, for each of runIDs that exists, its newest event's
// sequence and its state, in one statement: what a node's watch poller
// needs to know whether any follower of those runs has something to read.
func (s *Runs) Heads(ctx context.Context, runIDs []string) (map[string]runs.Head, error) {
	if len(runIDs) == 0 {
		return nil, nil
	}
	heads, err := retry(ctx, s.log, "runs.heads", idempotent, func(ctx context.Context, _ try) (map[string]runs.Head, error) {
		rows, err := s.q.Heads(ctx, s.pool, runIDs)
		if err != nil {
			return nil, err
		}
		heads := make(map[string]runs.Head, len(rows))
		for _, r := range rows {
			st, err := runs.ParseState(r.State)
			if err != nil {
				return nil, fmt.Errorf("run %s: stored state: %w", r.RunID, err)
			}
			heads[r.RunID] = runs.Head{Sequence: r.LastSequence, State: st}
		}
		return heads, nil
	})
	if err != nil {
		return nil, fmt.Errorf("read run heads: %w", err)
	}
	return heads, nil
}
