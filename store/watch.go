package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store/internal/dbsqlc"
)

// WatchSource implements budget.WatchSource: run notices from the
// process's Notifier, and a query of run accounts for the poll.
type WatchSource struct {
	db
	notifier *Notifier
}

var _ budget.WatchSource = (*WatchSource)(nil)

// NewWatchSource returns a source that polls through pool and hears run
// notices from n (nil: the poll alone).
func NewWatchSource(pool *pgxpool.Pool, n *Notifier) *WatchSource {
	return &WatchSource{db: newDB(pool, nil), notifier: n}
}

// Listen implements budget.WatchSource: until ctx ends, or ErrNoNotifier at
// once without a Notifier (which reconnects on its own).
func (s *WatchSource) Listen(ctx context.Context, ready func(), deliver func(budget.RunSignal)) error {
	return s.notifier.subscribe(ctx, ready, map[string]func(string){runStateChannel: func(payload string) {
		if state, runID, ok := strings.Cut(payload, " "); ok {
			deliver(budget.RunSignal{RunID: runID, State: budget.AccountState(state)})
		}
	}})
}

// EndedRuns implements budget.WatchSource.
func (s *WatchSource) EndedRuns(ctx context.Context, runIDs []string) ([]budget.RunSignal, error) {
	rows, err := retry(ctx, s.log, "watch.ended_runs", idempotent, func(ctx context.Context, _ try) ([]dbsqlc.EndedRunsRow, error) {
		return s.q.EndedRuns(ctx, s.pool, runIDs)
	})
	if err != nil {
		return nil, fmt.Errorf("read run states: %w", err)
	}
	sigs := make([]budget.RunSignal, len(rows))
	for i, r := range rows {
		sigs[i] = budget.RunSignal{RunID: r.RunID, State: budget.AccountState(r.State), Cause: r.Cause}
	}
	return sigs, nil
}
