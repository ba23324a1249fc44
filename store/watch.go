package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fanout/fanout/budget"
)

// WatchSource implements budget.WatchSource: run notices from the
// process's Notifier, and a query of run accounts for the poll.
type WatchSource struct {
	pool     *pgxpool.Pool
	notifier *Notifier
}

var _ budget.WatchSource = (*WatchSource)(nil)

// NewWatchSource returns a source that polls through pool and hears run
// notices from n (nil: the poll alone).
func NewWatchSource(pool *pgxpool.Pool, n *Notifier) *WatchSource {
	return &WatchSource{pool: pool, notifier: n}
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
	rows, err := s.pool.Query(ctx, `SELECT run_id, state, cause FROM account
		WHERE kind = 'run' AND run_id = ANY ($1) AND state <> 'open'`, runIDs)
	if err != nil {
		return nil, fmt.Errorf("read run states: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (budget.RunSignal, error) {
		var sig budget.RunSignal
		err := row.Scan(&sig.RunID, &sig.State, &sig.Cause)
		return sig, err
	})
}
