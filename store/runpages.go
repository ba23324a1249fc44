package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store/internal/dbsqlc"
)

// A page of a run's tasks or facts (ListRunTasks, ListRunFacts) costs what
// the page holds, not what the run does: the tasks by dispatch index, the
// facts sliced out of the result's jsonb by PostgreSQL.

// RunTasks returns up to limit of the outcomes of tenantID's run runID in
// dispatch order, from dispatch index from, and how many tasks the run has.
// Returns runs.ErrNotFound if the tenant has no such run.
func (s *Runs) RunTasks(ctx context.Context, tenantID, runID string, from, limit int) ([]*fanoutv1.TaskOutcome, int, error) {
	type page struct {
		tasks []*fanoutv1.TaskOutcome
		total int
	}
	p, err := retry(ctx, s.log, "runs.read_task_page", idempotent, func(ctx context.Context, _ try) (page, error) {
		total, err := s.q.RunTaskCount(ctx, s.pool, dbsqlc.RunTaskCountParams{RunID: runID, TenantID: tenantID})
		if err != nil {
			return page{}, err
		}
		rows, err := s.q.RunTaskPage(ctx, s.pool, dbsqlc.RunTaskPageParams{RunID: runID,
			FromIndex: int32(min(from, math.MaxInt32)), MaxTasks: int32(min(limit, math.MaxInt32))}) //nolint:gosec // clamped
		if err != nil {
			return page{}, err
		}
		out := page{total: int(total)}
		for _, r := range rows {
			o, err := taskRow(r).outcome()
			if err != nil {
				return page{}, err
			}
			out.tasks = append(out.tasks, o)
		}
		return out, nil
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, 0, fmt.Errorf("run %s: %w", runID, runs.ErrNotFound)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read tasks of run %s: %w", runID, err)
	}
	return p.tasks, p.total, nil
}

// runFactPageSQL slices a page out of a tenant's run's joined facts (the
// result's jsonb, protojson records) and counts them: no row for no such
// run of the tenant, no facts while the run has no result. Hand-written:
// sqlc does not know the columns of WITH ORDINALITY.
const runFactPageSQL = `SELECT coalesce(jsonb_array_length(r.result->'facts'), 0)::int,
    coalesce((SELECT jsonb_agg(f.fact ORDER BY f.i)
              FROM jsonb_array_elements(r.result->'facts') WITH ORDINALITY AS f(fact, i)
              WHERE f.i > $3 AND f.i <= $3 + $4), '[]')
FROM run r
WHERE r.run_id = $1 AND r.tenant_id = $2`

// RunFacts returns up to limit of the facts of tenantID's run runID's
// joined result, from index from, and how many it has (none while the run
// has no result). Returns runs.ErrNotFound if the tenant has no such run.
func (s *Runs) RunFacts(ctx context.Context, tenantID, runID string, from, limit int) ([]*fanoutv1.Fact, int, error) {
	type page struct {
		facts []*fanoutv1.Fact
		total int
	}
	p, err := retry(ctx, s.log, "runs.read_fact_page", idempotent, func(ctx context.Context, _ try) (page, error) {
		var out page
		var raw []byte
		err := s.pool.QueryRow(ctx, runFactPageSQL, runID, tenantID, int64(from), int64(limit)).Scan(&out.total, &raw)
		if err != nil {
			return page{}, err
		}
		var recs []*factRecord
		if err := json.Unmarshal(raw, &recs); err != nil {
			return page{}, fmt.Errorf("decode facts: %w", err)
		}
		out.facts = each(recs, (*factRecord).proto)
		return out, nil
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, 0, fmt.Errorf("run %s: %w", runID, runs.ErrNotFound)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read facts of run %s: %w", runID, err)
	}
	return p.facts, p.total, nil
}
