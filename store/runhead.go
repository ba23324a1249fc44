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
// for an empty tenantID.
func (s *Runs) Head(ctx context.Context, tenantID, runID string) (runs.Head, error) {
	if tenantID == "" {
		return runs.Head{}, fmt.Errorf("read the head of run %s: %w", runID, runs.ErrNoTenant)
	}
	var seq int64
	var state string
	err := s.pool.QueryRow(ctx, `SELECT last_sequence, state FROM run
		WHERE run_id = $1 AND tenant_id = $2`, runID, tenantID).Scan(&seq, &state)
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
