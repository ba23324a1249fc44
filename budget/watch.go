package budget

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/fanout/fanout/internal/poll"
)

// ErrRunCancelled is the cancel cause of work whose run was cancelled
// (CancelRun, a join policy, or the caller going away).
var ErrRunCancelled = errors.New("run cancelled")

// RunSignal says that a run's budget ended: exhausted, cancelled or closed.
type RunSignal struct {
	RunID string
	State AccountState
	Cause string
}

// Err returns the cancel cause for work of the run: ErrExhausted for an
// exhausted run, ErrRunCancelled otherwise.
func (s RunSignal) Err() error {
	if s.State == StateExhausted {
		return ErrExhausted
	}
	return ErrRunCancelled
}

// WatchSource is where a Watcher hears about runs. Package store implements it
// with LISTEN/NOTIFY on a dedicated connection and a query of run accounts.
type WatchSource interface {
	// Listen delivers every run notice until ctx ends, reconnecting on its
	// own when its connection is lost, and calls ready each time it is
	// listening again (what was sent meanwhile is gone). It returns nil
	// when ctx ends, or an error at once if it cannot listen at all.
	Listen(ctx context.Context, ready func(), deliver func(RunSignal)) error
	// EndedRuns returns the signals of those runIDs whose run account has ended.
	EndedRuns(ctx context.Context, runIDs []string) ([]RunSignal, error)
}

// minPollTimeout is the least time a poll's reads may take (twice
// PollInterval, when that is longer).
const minPollTimeout = 2 * time.Second

// DefaultPollInterval is how often a Watcher polls the runs it watches
// when its config sets no interval.
const DefaultPollInterval = time.Second

// WatcherConfig tunes a Watcher. Zero values take the documented defaults.
type WatcherConfig struct {
	PollInterval time.Duration // how often watched runs are polled; default DefaultPollInterval
	Logger       *slog.Logger  // default slog.Default()
}

// Watcher tells subscribers what ended a run's budget — whichever of the
// notice and the poll sees it first. A run's state only moves forward:
// open, then exhausted, then cancelled or closed. A subscriber hears the
// first end once (Subscription.Done), and, if that was exhaustion, hears
// once more when the run is then cancelled or closed
// (Subscription.Cancelled): under DRAIN an exhausted run's calls run on,
// and only that second signal stops them. Other later news (exhaustion
// again, a second cancel) changes nothing. A notice sent while the
// listener was disconnected is lost for good; the poll of watched runs
// covers that gap, until a run has been heard cancelled or closed.
type Watcher struct {
	src  WatchSource
	cfg  WatcherConfig
	loop *poll.Loop // polls every PollInterval, and when a notice or a reconnect wakes it

	mu   sync.Mutex
	subs map[string]map[*Subscription]struct{}
	news map[string]runNews // what was heard of each watched run, kept while it is watched
}

// runNews is what a Watcher heard of one run: its first end and, when that
// was exhaustion, the cancel or close after it.
type runNews struct {
	first RunSignal // zero until the run ended
	stop  RunSignal // the run cancelled or closed (also when that was first); zero until then
}

// stops reports whether a run in state s stops all its work, whatever its
// exhaustion policy.
func stops(s AccountState) bool { return s == StateCancelled || s == StateClosed }

// hear adds sig to what n knew, and reports whether it was news.
func (n *runNews) hear(sig RunSignal) bool {
	switch {
	case n.first.State == "":
		n.first = sig
	case n.stop.State == "" && stops(sig.State):
	default:
		return false // exhausted again, or a run that already stopped
	}
	if stops(sig.State) {
		n.stop = sig
	}
	return true
}

// NewWatcher returns a watcher on src. Call Run to start it.
func NewWatcher(src WatchSource, cfg WatcherConfig) *Watcher {
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Watcher{
		src:  src,
		cfg:  cfg,
		loop: poll.New(),
		subs: map[string]map[*Subscription]struct{}{},
		news: map[string]runNews{},
	}
}

// Subscription is one subscriber's interest in one run.
type Subscription struct {
	w      *Watcher
	runID  string
	first  latch // the run's budget ended
	cancel latch // the run was cancelled or closed
}

// latch holds a signal that is set once; ch is closed when it is.
type latch struct {
	once sync.Once
	ch   chan struct{}
	sig  RunSignal
}

func (l *latch) set(sig RunSignal) {
	l.once.Do(func() {
		l.sig = sig
		close(l.ch)
	})
}

func (l *latch) get() RunSignal {
	<-l.ch
	return l.sig
}

// Done is closed when the run's budget has ended: exhausted, cancelled or
// closed, whichever came first.
func (s *Subscription) Done() <-chan struct{} { return s.first.ch }

// Signal returns what first ended the run; valid once Done is closed.
func (s *Subscription) Signal() RunSignal { return s.first.get() }

// Cancelled is closed when the run is cancelled or closed: with Done if
// that ended it, or later if it was exhausted first. Work that an exhausted
// run lets finish (DRAIN) stops when it is closed.
func (s *Subscription) Cancelled() <-chan struct{} { return s.cancel.ch }

// CancelSignal returns the run's cancel or close; valid once Cancelled is
// closed.
func (s *Subscription) CancelSignal() RunSignal { return s.cancel.get() }

// Close removes the subscription. Safe to call more than once.
func (s *Subscription) Close() {
	w := s.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if set := w.subs[s.runID]; set != nil {
		delete(set, s)
		if len(set) == 0 {
			delete(w.subs, s.runID)
			delete(w.news, s.runID)
		}
	}
}

// tell fires what s has not yet been told of n.
func (s *Subscription) tell(n runNews) {
	if n.first.State != "" {
		s.first.set(n.first)
	}
	if n.stop.State != "" {
		s.cancel.set(n.stop)
	}
}

// Subscribe starts watching runID. What is already known of the run is
// told at once: Done (and Cancelled) are closed before it returns.
func (w *Watcher) Subscribe(runID string) *Subscription {
	s := &Subscription{w: w, runID: runID,
		first: latch{ch: make(chan struct{})}, cancel: latch{ch: make(chan struct{})}}
	w.mu.Lock()
	defer w.mu.Unlock()
	set := w.subs[runID]
	if set == nil {
		set = map[*Subscription]struct{}{}
		w.subs[runID] = set
	}
	set[s] = struct{}{}
	s.tell(w.news[runID])
	return s
}

// deliver tells every subscriber of sig's run what is news in it.
func (w *Watcher) deliver(sig RunSignal) {
	w.mu.Lock()
	defer w.mu.Unlock()
	set := w.subs[sig.RunID]
	if set == nil {
		return // nobody here cares about that run
	}
	n := w.news[sig.RunID]
	if !n.hear(sig) {
		return
	}
	w.news[sig.RunID] = n
	for s := range set {
		s.tell(n)
	}
}

// isNews reports whether sig would be news to a subscriber of its run.
func (w *Watcher) isNews(sig RunSignal) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.subs[sig.RunID] == nil {
		return false
	}
	n := w.news[sig.RunID]
	return n.hear(sig)
}

// notice handles a notice heard by the listener: it only wakes the poll
// when the notice would be news of a watched run. Any database login may
// NOTIFY, so a notice is a hint, never an order: the poll reads every
// watched run's account row (EndedRuns) and delivers what the rows say,
// with their causes ("tenant budget exhausted" or the run's own "budget
// exhausted"); a notice of a run the row shows open changes nothing. The
// listener's goroutine, which every node's other notifications (key
// revocations) share, never waits on the database.
func (w *Watcher) notice(sig RunSignal) {
	if sig.State == StateOpen {
		w.Reopened(sig.RunID)
		return
	}
	if w.isNews(sig) {
		w.loop.Wake()
	}
}

// Reopened forgets what was heard of runID's end: a continuation reopened
// the run (ledger_continue_run's 'open RUN' notice, or the node that
// continued it), and a new subscription must not be told of the end
// before. Subscriptions already told keep what they were told (they were
// of that end). A forged notice costs a poll: the poll reads the run's
// account again and tells new subscribers what it says.
func (w *Watcher) Reopened(runID string) {
	w.mu.Lock()
	delete(w.news, runID)
	w.mu.Unlock()
	w.loop.Wake()
}

// watched returns the runs to poll: every watched run not yet heard
// cancelled or closed (an exhausted run may still be cancelled).
func (w *Watcher) watched() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := make([]string, 0, len(w.subs))
	for id := range w.subs {
		if w.news[id].stop.State == "" {
			ids = append(ids, id)
		}
	}
	return ids
}

// Run listens and polls until ctx ends. It returns ctx's error.
func (w *Watcher) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.listen(ctx)
	}()
	w.poll(ctx)
	wg.Wait()
	return ctx.Err()
}

// Poll checks every watched run once. Run calls it every PollInterval.
func (w *Watcher) Poll(ctx context.Context) error {
	ids := w.watched()
	if len(ids) == 0 {
		return nil
	}
	sigs, err := w.src.EndedRuns(ctx, ids)
	if err != nil {
		return err
	}
	for _, sig := range sigs {
		w.deliver(sig)
	}
	return nil
}

func (w *Watcher) poll(ctx context.Context) {
	w.loop.Run(ctx, w.cfg.PollInterval, func(ctx context.Context) {
		// Bounded: the reads retry a transient error only as long as this
		// allows, and the next poll tries again.
		pctx, cancel := context.WithTimeout(ctx, max(2*w.cfg.PollInterval, minPollTimeout))
		defer cancel()
		if err := w.Poll(pctx); err != nil && ctx.Err() == nil {
			w.cfg.Logger.Warn("budget watcher: poll runs", "err", err)
		}
	})
}

// listen hears notices until ctx ends (the source reconnects on its own
// and calls ready each time, after which the watcher polls: what was sent
// while it was away is gone). A source that cannot listen leaves the poll
// alone to carry changes.
func (w *Watcher) listen(ctx context.Context) {
	err := w.src.Listen(ctx, w.loop.Wake, w.notice)
	if err != nil && ctx.Err() == nil {
		w.cfg.Logger.Warn("budget watcher: no notices; the poll alone carries run ends", "err", err,
			"poll_interval", w.cfg.PollInterval)
	}
}
