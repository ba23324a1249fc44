package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// Followers (WatchRun and Run streams) of every run, on this node, share
// what tells them that their run moved, and one read of its new events.
// An append made on this node wakes its followers at once (Engine.wake),
// and the run's end hands them its closing events as it commits them
// (followers.publish: no read between the commit and the streams). What
// other nodes append is announced by PostgreSQL: once a write of a run's
// events has committed, the writer NOTIFYs the run's new head on one
// fixed channel (store.RunEventsChannel), from a transaction of its own
// a few milliseconds later; the node's one LISTEN connection hands it to
// moved, and only runs followed here are woken. A notification is lost
// while that connection is down, and when the writer dies or its NOTIFY
// fails: when the connection is back (resync), and every
// WatchFallbackPoll in case one is lost otherwise, the node reads the
// heads of every run followed here in one query (poll). Without
// notifications (EngineParams.Events nil) that poll runs every
// WatchPollInterval instead, as it did before (8,000 streams each polling
// alone drove Postgres to ~37k transactions/s, issue 12; one poll every
// 150 ms for them all did not).
//
// Each stream reads from its own cursor: the run's latest events (its
// tail, up to tailEvents) are read from the store once for every stream of
// the run on this node, and only a stream further behind than the tail
// reads the store itself (5,000 streams each reading on every move of the
// head kept a concurrent run waiting for the pool over 90s, issue 12).
// With nothing followed, the poller reads nothing: an idle node commits no
// transaction for it.

// tailEvents is how many of a followed run's latest events a node keeps
// for its streams.
const tailEvents = 2048

// followers is the node's poller and the runs it follows.
type followers struct {
	store    EventReader
	interval time.Duration
	onError  func(error)
	resyncs  chan struct{} // a poll now (resync); buffered, 1

	mu   sync.Mutex
	runs map[string]*followed
}

// followed is one run that streams on this node follow.
type followed struct {
	streams int
	head    runs.Head     // as last read
	changed chan struct{} // closed and replaced when the head moves

	moves int64 // how many times changed was closed

	// What the streams' shared reads found: tail is the run's latest
	// events, consecutive, ending at readTo (readTo -1: none read yet);
	// readAt is moves when the last complete read began (-1: read again).
	tail     []*fanoutv1.RunEvent
	readTo   int64
	readAt   int64
	fetching chan struct{} // while a stream reads for all: closed when it is done
}

// move tells r's streams that its head moved. The caller holds f.mu.
func (r *followed) move() {
	close(r.changed)
	r.changed = make(chan struct{})
	r.moves++
}

func newFollowers(store EventReader, interval time.Duration, onError func(error)) *followers {
	return &followers{store: store, interval: interval, onError: onError, resyncs: make(chan struct{}, 1),
		runs: map[string]*followed{}}
}

// follow registers one more stream of runID; unfollow must follow.
func (f *followers) follow(runID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.runs[runID]
	if r == nil {
		r = &followed{changed: make(chan struct{}), readTo: -1, readAt: -1}
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

// events returns up to limit of runID's events with sequence > after. The
// run's streams on this node share their reads of its latest events: from
// the tail when after is in it; through one read of the store (own) for
// every stream waiting at the end of what has been read, and none at all
// when nothing moved the head since the last such read and known (the
// latest sequence the stream knows of) has been read; through the stream's
// own read when after is before the tail. runID must be followed.
func (f *followers) events(ctx context.Context, runID string, after, known int64, limit int,
	own func(after int64) ([]*fanoutv1.RunEvent, error)) ([]*fanoutv1.RunEvent, error) {
	for {
		f.mu.Lock()
		r := f.runs[runID]
		first := r.readTo - int64(len(r.tail)) + 1 // of the tail
		switch {
		case len(r.tail) > 0 && after >= first-1 && after < r.readTo:
			from := after - first + 1
			evs := slices.Clone(r.tail[from:min(from+int64(limit), int64(len(r.tail)))])
			f.mu.Unlock()
			return evs, nil
		case after < r.readTo:
			f.mu.Unlock()
			return own(after)
		case r.fetching != nil:
			wait := r.fetching
			f.mu.Unlock()
			select {
			case <-wait:
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
			continue
		case after == r.readTo && r.readAt == r.moves && known <= r.readTo:
			f.mu.Unlock()
			return nil, nil // the last read started after the last move and found nothing more
		}
		// Read what follows after for every stream of the run.
		done := make(chan struct{})
		r.fetching = done
		at := r.moves
		f.mu.Unlock()
		evs, err := own(after)
		f.mu.Lock()
		switch {
		case err != nil:
			r.readAt = -1
		case len(evs) == 0 && after != r.readTo:
			// Nothing past a point ahead of the tail (a stream asking
			// for more than the run has): it tells nothing of what
			// follows the tail, which stays as it was.
		case after != r.readTo: // ahead of the tail: start a new one
			r.tail, r.readAt = evs, at
		default:
			r.tail, r.readAt = append(r.tail, evs...), at
		}
		if err == nil && len(evs) > 0 {
			r.readTo = evs[len(evs)-1].GetSequence()
			if n := len(r.tail) - tailEvents; n > 0 {
				r.tail = slices.Delete(r.tail, 0, n)
			}
			// The run's other streams may wait for these events without
			// having been woken for them (a stream that knew of a later
			// head read them before their notices came, and moved takes
			// those as read now): wake them. They find the events in the
			// tail, and those at its end know that nothing more is there
			// unless another move came during the read.
			upToDate := r.readAt == r.moves
			r.move()
			if upToDate {
				r.readAt = r.moves
			}
		}
		if len(evs) == limit {
			r.readAt = -1 // there may be more: the next stream at the end reads again
		}
		r.fetching = nil
		close(done)
		f.mu.Unlock()
		if err != nil || len(evs) == 0 {
			return nil, err
		}
	}
}

// wake tells runID's streams that something may have been appended.
func (f *followers) wake(runID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.runs[runID]; r != nil {
		r.move()
	}
}

// publish is wake for events this node has just appended and holds as
// stored (consecutive, with their sequences; durable): when they follow
// the tail that the streams read, they join it, so that a stream at the
// end sends them without a read of the store. Otherwise (a gap: events
// another writer appended are not read yet; or a shared read in flight,
// which may or may not see them) they are only a wake, and the streams'
// next shared read finds them, as it finds every event.
func (f *followers) publish(runID string, evs []*fanoutv1.RunEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.runs[runID]
	if r == nil {
		return
	}
	upToDate := r.readAt == r.moves // the last read missed no move: the tail was the whole log
	r.move()
	if len(evs) == 0 || r.fetching != nil || r.readTo < 0 || evs[0].GetSequence() != r.readTo+1 {
		return
	}
	r.tail = append(r.tail, evs...)
	r.readTo = evs[len(evs)-1].GetSequence()
	if n := len(r.tail) - tailEvents; n > 0 {
		r.tail = slices.Delete(r.tail, 0, n)
	}
	if upToDate {
		// The tail is the log up to these events: a stream that sent them
		// has nothing more to read until the next move.
		r.readAt = r.moves
	}
}

// moved is what a notification says: runID's log now ends at head (a
// hint: any login may NOTIFY). Its streams here are woken unless the tail
// they share reaches head already: the end this node published, or a read
// that overtook the notification (which woke them itself, events). A
// forged head costs one read of the run.
// It runs on the notifier's goroutine and returns at once.
func (f *followers) moved(runID string, head int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.runs[runID]; r != nil && head > r.readTo {
		r.move()
	}
}

// resync has the poller read the heads of every followed run now: the
// notifications sent while the node was not listening are gone. It does
// not wait.
func (f *followers) resync() {
	select {
	case f.resyncs <- struct{}{}:
	default: // one is due already
	}
}

// Backoff of a failed read of the heads: it is tried again after
// pollRetryMin, doubling up to pollRetryMax (and never later than the next
// poll). A resync follows a reconnect, usually after the database
// restarted, when the read often fails: waiting for the fallback poll
// (3 s) would leave the streams that long without what they missed.
const (
	pollRetryMin = 100 * time.Millisecond
	pollRetryMax = time.Second
)

// poll reads the heads of every followed run every interval, at once on
// resync, and soon again after a failed read, until ctx ends.
func (f *followers) poll(ctx context.Context) {
	tick := time.NewTicker(f.interval)
	defer tick.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	backoff := pollRetryMin
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-f.resyncs:
		case <-retry.C:
		}
		retry.Stop()
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
			retry.Reset(min(backoff, f.interval))
			backoff = min(2*backoff, pollRetryMax)
			continue
		}
		backoff = pollRetryMin
		f.mu.Lock()
		for id, h := range heads {
			if r := f.runs[id]; r != nil && h != r.head {
				r.head = h
				r.move()
			}
		}
		f.mu.Unlock()
	}
}

// watchPage is how many events a stream reads at a time.
const watchPage = 256

// Slow readers. Each stream reads from its own cursor, so a reader that
// does not keep up costs the node no shared buffer; what it holds is a
// goroutine, a stream slot (--max-streams) and, once the client stops
// reading, a Send blocked on gRPC flow control for as long as the
// connection lives. A stream therefore ends, RESOURCE_EXHAUSTED naming the
// after_sequence to resume from, when it has stayed more than WatchMaxLag
// (1,000) events behind its run's head for WatchSlowAfter (10s) without a
// break.
//
// The rule is timed, not a threshold, because a gap of 1,000 at one
// instant is normal: a run's first wave writes up to 1,000 TaskQueued
// events in one write, and a reader replaying a long history starts
// thousands behind. A reader that keeps up closes such a gap in
// milliseconds; 10s behind by more than 1,000 is a reader consuming at
// well under 100 events a second, or not at all. One that is ended this
// way and resumes covers at least ten seconds' worth each time, so even a
// slow link gets through a finished history.
//
// Events are sent from a goroutine of the stream's (watchSender), so that
// the stream can still see the time pass while a Send is blocked, and end
// it: returning from the gRPC handler closes the stream, which fails the
// blocked Send.

// slowGrace is how long a stream that is ending as a slow reader waits for
// a Send in flight to return, so that the sequence it names counts that
// event if it was delivered.
const slowGrace = 50 * time.Millisecond

// SlowReaderError ends a stream that stayed more than MaxLag events behind
// its run for For. After is the last sequence the stream sent: resume with
// WatchRunRequest.after_sequence = After.
type SlowReaderError struct {
	After  int64
	MaxLag int64
	For    time.Duration
}

func (e *SlowReaderError) Error() string {
	return fmt.Sprintf("this stream stayed more than %d events behind the run for %v (a reader that does not keep up); "+
		"resume with after_sequence %d", e.MaxLag, e.For, e.After)
}

// lagRule tells when a stream is a slow reader: more than max events
// behind at every check for at least after.
type lagRule struct {
	max   int64
	after time.Duration
	since time.Time   // when the stream fell behind; zero while it is not
	timer *time.Timer // fires at since+after while behind
}

// check records the stream's lag at now and reports whether the stream is
// slow. wake is the channel that fires when the rule must be checked again
// without anything else happening (nil while the stream is not behind).
func (r *lagRule) check(now time.Time, lag int64) (slow bool, wake <-chan time.Time) {
	if lag <= r.max {
		r.since = time.Time{}
		if r.timer != nil {
			r.timer.Stop()
		}
		return false, nil
	}
	if r.since.IsZero() {
		r.since = now
		if r.timer == nil {
			r.timer = time.NewTimer(r.after)
		} else {
			r.timer.Reset(r.after)
		}
	}
	return now.Sub(r.since) >= r.after, r.timer.C
}

func (r *lagRule) stop() {
	if r.timer != nil {
		r.timer.Stop()
	}
}

// watchSender calls a stream's send from its own goroutine, a page of
// events at a time.
type watchSender struct {
	send  func(*fanoutv1.RunEvent) error
	pages chan []*fanoutv1.RunEvent
	done  chan error // one per page: nil, or what send returned

	mu       sync.Mutex
	sent     int64 // sequence of the last event send returned nil for
	inFlight bool
	stopped  bool
	returned chan struct{} // closed when the send in flight returns, once stopped
}

func newWatchSender(after int64, send func(*fanoutv1.RunEvent) error) *watchSender {
	s := &watchSender{send: send, pages: make(chan []*fanoutv1.RunEvent), done: make(chan error, 1), sent: after}
	go s.run()
	return s
}

// run sends pages until close (or stop) and returns after the send in
// flight, if any, returned: for a gRPC stream, once the handler returned.
func (s *watchSender) run() {
	for page := range s.pages {
		s.done <- s.sendPage(page)
	}
}

func (s *watchSender) sendPage(page []*fanoutv1.RunEvent) error {
	for _, ev := range page {
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			return errSenderStopped
		}
		s.inFlight = true
		s.mu.Unlock()
		err := s.send(ev)
		s.mu.Lock()
		s.inFlight = false
		if err == nil {
			s.sent = ev.GetSequence()
		}
		if s.returned != nil {
			close(s.returned)
			s.returned = nil
		}
		s.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

var errSenderStopped = errors.New("stream ended")

// last returns the sequence of the last event sent.
func (s *watchSender) last() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent
}

// stop sends nothing more and returns the sequence of the last event sent,
// after waiting up to slowGrace for a send in flight to return.
func (s *watchSender) stop() int64 {
	s.mu.Lock()
	s.stopped = true
	if !s.inFlight {
		defer s.mu.Unlock()
		return s.sent
	}
	returned := make(chan struct{})
	s.returned = returned
	s.mu.Unlock()
	t := time.NewTimer(slowGrace)
	defer t.Stop()
	select {
	case <-returned:
	case <-t.C:
	}
	return s.last()
}

// close ends the goroutine once its page is done; it does not wait.
func (s *watchSender) close() { close(s.pages) }

// Watch sends the run's events with sequence > after in order — stored
// history, then new events as they are stored, by this node or any other —
// until it has sent a RunFinished that is the last event it knows of (then
// it returns nil; a continued run has one RunFinished per end), send
// fails, or ctx
// ends. A run whose state is final but whose RunFinished is missing from
// the log (ended by an older version, or by hand) ends the stream with a
// RunFinished rebuilt from the run (sequence 0). Returns runs.ErrNotFound
// for an unknown run, and a *SlowReaderError for a reader that does not
// keep up (see above).
//
// send is called from another goroutine than Watch's, one call at a time.
// When Watch ends a slow reader while a send is blocked it returns without
// waiting for that send, which must return once the caller's stream has
// ended (gRPC's Send does when the handler returns).
func (e *Engine) Watch(ctx context.Context, tenantID, runID string, after int64,
	send func(*fanoutv1.RunEvent) error) error {
	head, err := e.store.Head(ctx, tenantID, runID)
	if err != nil {
		return err
	}
	e.followers.follow(runID)
	defer e.followers.unfollow(runID)
	sender := newWatchSender(after, send)
	defer sender.close()
	lag := lagRule{max: e.cfg.WatchMaxLag, after: e.cfg.WatchSlowAfter}
	defer lag.stop()
	own := func(after int64) ([]*fanoutv1.RunEvent, error) {
		return e.store.Events(ctx, tenantID, runID, after, watchPage)
	}
	var behind runs.Head // the last polled end behind the head that the store was asked about
	for {
		polled, changed := e.followers.state(runID)
		if polled.Final() && !head.Final() && polled.Sequence < head.Sequence && polled != behind {
			behind = polled
			// A run's log only grows, so an end behind the head this
			// stream knows is a stale read — or a database that lost the
			// events past it (a failover to a standby that lacked them,
			// docs/operations.md#what-a-lost-grant-does-asynchronous-replication):
			// the store says which. Believing the stream's own head would
			// wait for events that will never come.
			if now, err := e.store.Head(ctx, tenantID, runID); err == nil && now.Final() && now.Sequence < head.Sequence {
				head = now
			}
		}
		head = newer(head, polled)
		evs, err := e.followers.events(ctx, runID, after, head.Sequence, watchPage, own)
		if err != nil {
			return err
		}
		if len(evs) > 0 {
			head = newer(head, runs.Head{Sequence: evs[len(evs)-1].GetSequence(), State: head.State})
			sender.pages <- evs
			if err := e.awaitPage(ctx, runID, sender, &lag, head, changed); err != nil {
				return err
			}
			after = evs[len(evs)-1].GetSequence()
			if evs[len(evs)-1].GetRunFinished() != nil && head.Sequence <= after {
				// The run's end, with nothing after it: a continuation
				// that reopens the run later is seen by a new watch
				// (docs/budget.md#continue).
				return nil
			}
		}
		slow, wake := lag.check(time.Now(), head.Sequence-after)
		if slow {
			return &SlowReaderError{After: sender.stop(), MaxLag: lag.max, For: lag.after}
		}
		if len(evs) > 0 {
			continue // a page from the tail may end before the log does
		}
		if head.Final() {
			// The end is one write (CloseRun): read after a final head, the
			// log holds the RunFinished if it has one.
			return e.sendRebuiltEnd(ctx, tenantID, runID, sender)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-changed:
		case <-wake:
		}
	}
}

// awaitPage waits for sender to send the page it was given, checking the
// lag rule as the head moves and time passes.
func (e *Engine) awaitPage(ctx context.Context, runID string, sender *watchSender, lag *lagRule,
	head runs.Head, changed <-chan struct{}) error {
	for {
		slow, wake := lag.check(time.Now(), head.Sequence-sender.last())
		if slow {
			return &SlowReaderError{After: sender.stop(), MaxLag: lag.max, For: lag.after}
		}
		select {
		case err := <-sender.done:
			return err
		case <-ctx.Done():
			sender.stop()
			return context.Cause(ctx)
		case <-changed:
			var polled runs.Head
			polled, changed = e.followers.state(runID)
			head = newer(head, polled)
		case <-wake:
		}
	}
}

// newer returns the later of two reads of a run's head: a run's log only
// grows, and its state changes only with an event (a run's end appends its
// RunFinished, its continuation its RunContinued, in the same write).
func newer(a, b runs.Head) runs.Head {
	if b.Sequence > a.Sequence || (b.Sequence == a.Sequence && b.Final() && !a.Final()) {
		return b
	}
	return a
}

// sendRebuiltEnd sends a RunFinished rebuilt from the ended run.
func (e *Engine) sendRebuiltEnd(ctx context.Context, tenantID, runID string, sender *watchSender) error {
	run, err := e.store.GetRun(ctx, tenantID, runID)
	if err != nil {
		return err
	}
	sender.pages <- []*fanoutv1.RunEvent{{RunId: runID, Time: run.GetFinishedAt(), Event: &fanoutv1.RunEvent_RunFinished{
		RunFinished: &fanoutv1.RunFinished{State: run.GetState(), CancelCause: run.GetCancelCause(), Result: run.GetResult()}}}}
	select {
	case err := <-sender.done:
		return err
	case <-ctx.Done():
		sender.stop()
		return context.Cause(ctx)
	}
}
