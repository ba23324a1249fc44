package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store/internal/dbsqlc"
)

// Heartbeat refreshes, to database time, the lease (owner_heartbeat) of
// every run in runIDs that is RUNNING and owned by owner, in one statement.
// It returns the runs of runIDs that another node owns now: adopted while
// owner's heartbeat lapsed; owner must stop writing for them. Runs that
// ended or do not exist are neither refreshed nor returned.
func (s *Runs) Heartbeat(ctx context.Context, owner string, runIDs []string) (lost []string, err error) {
	if len(runIDs) == 0 {
		return nil, nil
	}
	// Idempotent: a second refresh of the same leases changes nothing more.
	lost, err = retry(ctx, s.log, "runs.heartbeat", idempotent, func(ctx context.Context, _ try) ([]string, error) {
		return s.q.Heartbeat(ctx, s.pool, dbsqlc.HeartbeatParams{RunIds: runIDs, Owner: owner})
	})
	if err != nil {
		return nil, fmt.Errorf("heartbeat %d runs of %s: %w", len(runIDs), owner, err)
	}
	return lost, nil
}

// AdoptOrphan makes node the owner of one RUNNING run whose heartbeat is
// older than orphanAfter (database time), the stalest first, refreshing its
// heartbeat and counting the adoption (unless node owned it already: its
// own lease lapsed), and returns it (RunID empty when no run is orphaned). The row is locked and its staleness re-checked by the
// UPDATE itself, so of several replicas adopting at once exactly one gets
// each run (the others skip it or find it fresh).
func (s *Runs) AdoptOrphan(ctx context.Context, node string, orphanAfter time.Duration) (runs.Adoption, error) {
	// Retried only when surely not done: an adoption that committed unheard
	// leaves the run to this node's next sweep once its lease lapses again.
	r, err := retry(ctx, s.log, "runs.adopt_orphan", unsentOnly, func(ctx context.Context, _ try) (dbsqlc.AdoptOrphanRow, error) {
		return s.q.AdoptOrphan(ctx, s.pool, dbsqlc.AdoptOrphanParams{Node: node, OrphanAfter: orphanAfter})
	})
	a := runs.Adoption{RunID: r.RunID, PrevOwner: r.PrevOwner, Adoptions: int(r.Adoptions), At: r.AdoptedAt}
	if errors.Is(err, pgx.ErrNoRows) {
		return runs.Adoption{}, nil
	}
	if err != nil {
		return runs.Adoption{}, fmt.Errorf("adopt an orphaned run for %s: %w", node, err)
	}
	return a, nil
}
