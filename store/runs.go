package store

import (
	"log/slog"
)

// Runs stores runs, their tasks and their event history (tables run, task
// and run_event). It implements orchestrator.RunStore. Every query names the
// tenant when the caller gives one; an empty tenant id matches any tenant
// (for the node that drives the run, which knows it owns it).
//
// Specs, outcomes, joined results and events are kept in jsonb columns as
// the store's own records (records.go), mapped from and to the API's
// messages here, so that SQL can read them; amounts stay typed columns.
//
// Unknown runs are reported as runs.ErrNotFound.
//
// Calls are retried after a transient database error (retry.go) where that
// cannot do their work twice: reads; updates that move a task or a run
// from a state they then leave, which settle an ambiguous commit by
// re-reading the row; and event appends, by the key of each event
// (run_event.event_key).
type Runs struct {
	db
	// events runs appendBatch, the one way events are written: inline (a
	// batch of one per call) or, with RunsConfig.Coalesce, group commit.
	events committer[*eventOp]
	// starts and finishes run startBatch and finishBatch: StartTask's and
	// FinishTask's calls, inline or, with Coalesce, the ones that arrive
	// together in one transaction.
	starts   committer[*startOp]
	finishes committer[*finishOp]
	// notices NOTIFYs the heads of the runs whose events were written, once
	// each write has returned (headnotices.go); nil: none (a benchmark of
	// the store's measures the appends without them).
	notices *headNotices
}

// RunsConfig tunes a Runs.
type RunsConfig struct {
	// Coalesce appends events that arrive together in one transaction (group
	// commit), and ends the tasks that end together (FinishTask) in one: a
	// run's events all take its row lock for their sequence, so a wide
	// fan-out otherwise queues thousands of transactions on one row.
	// A Runs with Coalesce must be closed with Close.
	Coalesce bool
	// Logger receives a warning for every retried database error. Default
	// slog.Default().
	Logger *slog.Logger
}

// NewRuns returns the run store on pool tuned by cfg (at most one; none:
// the zero RunsConfig, each event write its own transaction). A node's run
// store is Stores.Runs, on the API pool.
func NewRuns(pool *Pool, config ...RunsConfig) *Runs {
	cfg := configOf(config)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Runs{db: newDB(pool, cfg.Logger)}
	s.notices = newHeadNotices(pool, s.log)
	s.events = inlineCommit[*eventOp]{run: s.appendBatch}
	s.starts = inlineCommit[*startOp]{run: s.startBatch}
	s.finishes = inlineCommit[*finishOp]{run: s.finishBatch}
	if cfg.Coalesce {
		s.events = newGroupCommit(2, 256, s.appendBatch)
		s.starts = newGroupCommit(2, 256, s.startBatch)
		s.finishes = newGroupCommit(2, 256, s.finishBatch)
	}
	return s
}

// Close stops the event and task committers (a no-op without Coalesce)
// and waits for the notices of the heads they moved to be sent.
func (s *Runs) Close() {
	s.events.close()
	s.starts.close()
	s.finishes.close()
	s.notices.wait()
}

// announceRuns has the heads of the runs of a batch NOTIFYed
// (headNotices.announce), each run once.
func announceRuns[T any](h *headNotices, batch []*pending[T], runID func(T) string) {
	ids := make([]string, 0, len(batch))
	for _, p := range batch {
		if id := runID(p.item); len(ids) == 0 || ids[len(ids)-1] != id {
			ids = append(ids, id)
		}
	}
	h.announce(ids...)
}
