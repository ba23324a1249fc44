package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/store/internal/dbsqlc"
)

// TaskPrior returns what the whole tasks of tenantID spent with model in
// its earlier runs (sums, and how many tasks), zero when none has
// (task_prior; docs/budget.md#priors). A tenant reads its own only.
func (s *Runs) TaskPrior(ctx context.Context, tenantID, model string) (tasks, spent, peak int64, err error) {
	r, err := retry(ctx, s.log, "runs.task_prior", idempotent, func(ctx context.Context, _ try) (dbsqlc.TaskPriorRow, error) {
		r, err := s.q.TaskPrior(ctx, s.pool, dbsqlc.TaskPriorParams{TenantID: tenantID, Model: model})
		if errors.Is(err, pgx.ErrNoRows) {
			return dbsqlc.TaskPriorRow{}, nil
		}
		return r, err
	})
	return r.Tasks, r.Spent, r.Peak, err
}

// AddTaskPrior adds run runID's tasks (how many, what they spent and
// needed at their peak, in all) to tenantID's prior for model, once per
// run: it marks the run in the same statement, and returns added false when
// the run was marked already (an adopter ending the run again) or is gone.
// The mark makes a retry after an ambiguous commit safe.
func (s *Runs) AddTaskPrior(ctx context.Context, runID, tenantID, model string, tasks, spent, peak int64) (added bool, err error) {
	n, err := retry(ctx, s.log, "runs.add_task_prior", idempotent, func(ctx context.Context, _ try) (int64, error) {
		return s.q.AddTaskPrior(ctx, s.pool, dbsqlc.AddTaskPriorParams{RunID: runID,
			TenantID: tenantID, Model: model, Tasks: tasks, Spent: spent, Peak: max(peak, spent)})
	})
	return n > 0, err
}
