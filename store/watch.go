package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fanout/fanout/budget"
)

// runStateChannel is the NOTIFY channel the ledger functions signal on; the
// payload is "<state> <run_id>".
const runStateChannel = "fanout_run_state"

// ListenerApplicationName is the application_name of the listening
// connection, so operators (and tests) can find it in pg_stat_activity.
const ListenerApplicationName = "fanout-watch"

// WatchSource implements budget.WatchSource: LISTEN on a dedicated connection
// for run notices, and a query of run accounts for the poll.
type WatchSource struct {
	pool *pgxpool.Pool
	url  string
}

var _ budget.WatchSource = (*WatchSource)(nil)

// NewWatchSource returns a source that polls through pool and listens on its
// own connection to databaseURL (a pooled connection would be reused by others).
func NewWatchSource(pool *pgxpool.Pool, databaseURL string) *WatchSource {
	return &WatchSource{pool: pool, url: databaseURL}
}

// Listen implements budget.WatchSource.
func (s *WatchSource) Listen(ctx context.Context, ready func(), deliver func(budget.RunSignal)) error {
	cfg, err := pgx.ParseConfig(s.url)
	if err != nil {
		return fmt.Errorf("listen: %w", redactURLError(err))
	}
	cfg.RuntimeParams["application_name"] = ListenerApplicationName
	setSearchPath(cfg, Schema)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("listen: connect: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, "LISTEN "+runStateChannel); err != nil {
		return fmt.Errorf("listen %s: %w", runStateChannel, err)
	}
	ready()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
		state, runID, ok := strings.Cut(n.Payload, " ")
		if !ok {
			continue
		}
		deliver(budget.RunSignal{RunID: runID, State: budget.AccountState(state)})
	}
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
