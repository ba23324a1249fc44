package orchestrator

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// Followers (WatchRun and Run streams) of every run, on this node, share
// one poller: one read of the heads of all the runs followed here, every
// WatchPollInterval, instead of one query per stream per interval (8,000
// streams polling alone drove Postgres to ~37k transactions/s, issue 12).
// An append made on this node wakes its followers at once (Engine.wake);
// the poller finds what other nodes appended. Each stream then reads the
// events past its own cursor. With nothing followed, the poller reads
// nothing: an idle node commits no transaction for it.

// followers is the node's poller and the runs it follows.
type followers struct {
	store    RunStore
	interval time.Duration
	onError  func(error)

	mu   sync.Mutex
	runs map[string]*followed
}

// followed is one run that streams on this node follow.
type followed struct {
	streams int
	head    runs.Head     // as last read
	changed chan struct{} // closed and replaced when the head moves
}

func newFollowers(store RunStore, interval time.Duration, onError func(error)) *followers {
	return &followers{store: store, interval: interval, onError: onError, runs: map[string]*followed{}}
}

// follow registers one more stream of runID; unfollow must follow.
func (f *followers) follow(runID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.runs[runID]
	if r == nil {
		r = &followed{changed: make(chan struct{})}
		f.runs[runID] = r
	}
	r.streams++
}

func (f *followers) unfollow(runID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.runs[runID]; r != nil {
		if r.streams--; r.streams == 0 {
			delete(f.runs, runID)
		}
	}
}

// state returns runID's head as last read and a channel closed when it
// next moves. Read it before the events, so that no event is missed.
func (f *followers) state(runID string) (runs.Head, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.runs[runID]
	if r == nil {
		return runs.Head{}, nil
	}
	return r.head, r.changed
}

// wake tells runID's streams that something may have been appended.
func (f *followers) wake(runID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.runs[runID]; r != nil {
		close(r.changed)
		r.changed = make(chan struct{})
	}
}

// poll reads the heads of every followed run until ctx ends.
func (f *followers) poll(ctx context.Context) {
	tick := time.NewTicker(f.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		f.mu.Lock()
		ids := slices.Sorted(maps.Keys(f.runs))
		f.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, max(f.interval, time.Second))
		heads, err := f.store.Heads(rctx, ids)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				f.onError(err)
			}
			continue
		}
		f.mu.Lock()
		for id, h := range heads {
			if r := f.runs[id]; r != nil && h != r.head {
				r.head = h
				close(r.changed)
				r.changed = make(chan struct{})
			}
		}
		f.mu.Unlock()
	}
}

// watchPage is how many events a stream reads at a time.
const watchPage = 256

// Watch sends the run's events with sequence > after in order — stored
// history, then new events as they are stored, by this node or any other —
// until it has sent RunFinished (then it returns nil), send fails, or ctx
// ends. A run whose state is final but whose RunFinished is missing from
// the log (ended by an older version, or by hand) ends the stream with a
// RunFinished rebuilt from the run (sequence 0). Returns runs.ErrNotFound
// for an unknown run.
func (e *Engine) Watch(ctx context.Context, tenantID, runID string, after int64,
	send func(*fanoutv1.RunEvent) error) error {
	if _, err := e.store.GetRun(ctx, tenantID, runID); err != nil {
		return err
	}
	e.followers.follow(runID)
	defer e.followers.unfollow(runID)
	for {
		head, changed := e.followers.state(runID)
		evs, err := e.store.Events(ctx, tenantID, runID, after, watchPage)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			if err := send(ev); err != nil {
				return err
			}
			after = ev.GetSequence()
			if ev.GetRunFinished() != nil {
				return nil
			}
		}
		if len(evs) == watchPage {
			continue
		}
		if head.Final() {
			// The end is one write (FinishRun): read after a final head, the
			// log holds the RunFinished if it has one.
			return e.sendRebuiltEnd(ctx, tenantID, runID, send)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-changed:
		}
	}
}

// sendRebuiltEnd sends a RunFinished rebuilt from the ended run.
func (e *Engine) sendRebuiltEnd(ctx context.Context, tenantID, runID string, send func(*fanoutv1.RunEvent) error) error {
	run, err := e.store.GetRun(ctx, tenantID, runID)
	if err != nil {
		return err
	}
	return send(&fanoutv1.RunEvent{RunId: runID, Time: run.GetFinishedAt(), Event: &fanoutv1.RunEvent_RunFinished{
		RunFinished: &fanoutv1.RunFinished{State: run.GetState(), CancelCause: run.GetCancelCause(), Result: run.GetResult()}}})
}
