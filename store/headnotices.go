package store

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Head notices: every node's WatchRun followers hear of the events any
// node writes through a NOTIFY on RunEventsChannel, whose payload is
// "<run_id> <last_sequence>" for each run whose log moved, joined by ","
// (as many runs a notification as fit within NOTIFY's 8,000 bytes,
// counted in bytes: notifyPayloadBytes).
//
// The NOTIFY is not sent by the transaction that appends. PostgreSQL
// serializes every commit that notifies, from taking its notify lock until
// the commit is durable (the lock is held through the WAL flush): appends
// that each notified would commit one fsync at a time, database-wide
// (BenchmarkAppendNotify, docs/operations.md "Followers"). Instead, once a
// write of a run's events has returned (committed or not), the run store
// hands the run to its headNotices, which sends one statement for all the
// runs handed to it meanwhile, one at a time per process: it reads their
// heads as committed and NOTIFYs them in a transaction of its own that
// commits without waiting for its WAL flush (synchronous_commit off: it
// writes nothing, and the lock is held for microseconds). A notice is
// lost when the process dies between the append's commit and its notice,
// and when the sender's statement fails or gives up (after 5 s; it logs
// it): a hint lost, which followers make up on their fallback poll.
type headNotices struct {
	pool *pgxpool.Pool
	log  *slog.Logger

	mu      sync.Mutex
	pending map[string]struct{} // runs to announce
	sending bool                // a sender goroutine runs
	idle    *sync.Cond          // signalled when sending turns false
}

// A notification's runs, counted in bytes: each run's entry (its id, a
// space, its head, a comma) starts within notifyPayloadBytes of the
// notification's start, so that the payload, with the last entry whole,
// is at most notifyPayloadBytes + notifyRunIDBytes + 21 bytes, under
// NOTIFY's limit of 8,000. A run whose id is longer than notifyRunIDBytes
// (this server's are UUIDs, 36 bytes) is not announced: its followers on
// other nodes find its events by their poll.
const (
	notifyPayloadBytes = 7000
	notifyRunIDBytes   = 900
)

// notifyHeadsSQL NOTIFYs the heads of the runs $1, split into
// notifications by their entries' offsets ($2 notifyPayloadBytes, $3
// notifyRunIDBytes), from a transaction that does not wait for its commit
// to be flushed (it writes nothing but the notifications).
const notifyHeadsSQL = `
	SELECT set_config('synchronous_commit', 'off', true),
	       pg_notify('` + RunEventsChannel + `', string_agg(entry, ','))
	  FROM (SELECT entry, (sum(octet_length(entry) + 1) OVER (ORDER BY run_id) - octet_length(entry) - 1) / $2 AS part
	          FROM (SELECT run_id, run_id || ' ' || last_sequence AS entry
	                  FROM run WHERE run_id = ANY($1) AND octet_length(run_id) <= $3) AS r) AS moved
	 GROUP BY part`

func newHeadNotices(pool *pgxpool.Pool, log *slog.Logger) *headNotices {
	h := &headNotices{pool: pool, log: log, pending: map[string]struct{}{}}
	h.idle = sync.NewCond(&h.mu)
	return h
}

// announce has the heads of runIDs NOTIFYed soon. It does not wait. A nil
// headNotices announces nothing.
func (h *headNotices) announce(runIDs ...string) {
	if h == nil || len(runIDs) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range runIDs {
		h.pending[id] = struct{}{}
	}
	if !h.sending {
		h.sending = true
		go h.send()
	}
}

// send NOTIFYs the pending runs, one statement at a time, until none is
// left.
func (h *headNotices) send() {
	for {
		h.mu.Lock()
		if len(h.pending) == 0 {
			h.sending = false
			h.idle.Broadcast()
			h.mu.Unlock()
			return
		}
		ids := slices.Sorted(maps.Keys(h.pending))
		clear(h.pending)
		h.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := h.pool.Exec(ctx, notifyHeadsSQL, ids, notifyPayloadBytes, notifyRunIDBytes)
		cancel()
		if err != nil {
			h.log.Warn("notify the heads of runs whose events were written; other nodes' followers find them by their poll",
				"runs", len(ids), "err", err)
		}
	}
}

// wait returns once nothing is being sent. A nil headNotices has nothing
// to wait for.
func (h *headNotices) wait() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for h.sending {
		h.idle.Wait()
	}
}
