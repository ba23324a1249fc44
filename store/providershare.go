package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// RunsNaming counts the RUNNING runs of the fleet whose spec names provider
// and model ("" : names none), whatever their concurrency: the runs that
// share the limits Limits returns for them
// (docs/operations.md#concurrency-from-the-rate-limits). Made by each
// orchestrator once per provider and model per --concurrency-interval
// (shared by all its runs on them), never per dispatch; the partial index
// run_running_model (migration 0036) holds the RUNNING runs by the same
// expressions, so the count reads only the runs of this provider and model.
func (p *ProviderLimits) RunsNaming(ctx context.Context, provider, model string) (int, error) {
	var n int
	err := retried(ctx, p.log, "providerlimits.runs_naming", idempotent, func(ctx context.Context, _ try) error {
		return p.pool.QueryRow(ctx, runsNamingSQL, provider, model).Scan(&n)
	})
	if err != nil {
		return 0, fmt.Errorf("count the running runs of provider %q model %q: %w", provider, model, err)
	}
	return n, nil
}

// runsNamingSQL counts the RUNNING runs of a provider and model by the
// expressions of the index run_running_model.
const runsNamingSQL = `
	SELECT count(*) FROM run
	WHERE state = 'RUNNING'
	  AND coalesce(spec->'model'->>'provider', '') = $1
	  AND coalesce(spec->'model'->>'model', '') = $2`

// LastConcurrency returns run runID's latest ConcurrencyChosen event, or
// nil when it has none (a run whose concurrency is fixed): what GetRun
// shows of how its concurrency was chosen. The caller has read the run
// (its tenant checked).
func (s *Runs) LastConcurrency(ctx context.Context, runID string) (*fanoutv1.ConcurrencyChosen, error) {
	var ev *fanoutv1.RunEvent
	err := retried(ctx, s.log, "runs.last_concurrency", idempotent, func(ctx context.Context, _ try) error {
		var body []byte
		err := s.pool.QueryRow(ctx, `
			SELECT event FROM run_event
			WHERE run_id = $1 AND event ? 'concurrency_chosen'
			ORDER BY sequence DESC LIMIT 1`, runID).Scan(&body)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			ev = nil
			return nil
		case err != nil:
			return err
		}
		ev, err = decodeEvent(body)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read the concurrency of run %s: %w", runID, err)
	}
	return ev.GetConcurrencyChosen(), nil
}
