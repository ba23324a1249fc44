package budget

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
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
	// Listen delivers every run notice until ctx ends or the connection is
	// lost, and returns why it stopped. It calls ready once it is listening.
	Listen(ctx context.Context, ready func(), deliver func(RunSignal)) error
	// EndedRuns returns the signals of those runIDs whose run account has ended.
	EndedRuns(ctx context.Context, runIDs []string) ([]RunSignal, error)
}

// DefaultPollInterval is how often a Watcher polls the runs it watches
// when its config sets no interval.
const DefaultPollInterval = time.Second

// WatcherConfig tunes a Watcher. Zero values take the documented defaults.
type WatcherConfig struct {
	PollInterval time.Duration // how often watched runs are polled; default DefaultPollInterval
	MinBackoff   time.Duration // first reconnect delay; default 100ms
	MaxBackoff   time.Duration // reconnect delay cap; default 5s
	Logger       *slog.Logger  // default slog.Default()
}

// Watcher tells subscribers, once, that a run's budget ended — whichever of
// the notice and the poll sees it first. A notice sent while the listener was
// disconnected is lost for good; the poll of watched runs covers that gap.
type Watcher struct {
	src WatchSource
	cfg WatcherConfig

	mu    sync.Mutex
	subs  map[string]map[*Subscription]struct{}
	ended map[string]RunSignal // runs already signalled, kept while watched
}

// NewWatcher returns a watcher on src. Call Run to start it.
func NewWatcher(src WatchSource, cfg WatcherConfig) *Watcher {
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(5*time.Second, cfg.MinBackoff)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Watcher{
		src:   src,
		cfg:   cfg,
		subs:  map[string]map[*Subscription]struct{}{},
		ended: map[string]RunSignal{},
	}
}

// Subscription is one subscriber's interest in one run.
type Subscription struct {
	w     *Watcher
	runID string
	once  sync.Once
	done  chan struct{}
	sig   RunSignal
}

// Done is closed when the run's budget has ended.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Signal returns what ended the run; valid once Done is closed.
func (s *Subscription) Signal() RunSignal {
	<-s.done
	return s.sig
}

// Close removes the subscription. Safe to call more than once.
func (s *Subscription) Close() {
	w := s.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if set := w.subs[s.runID]; set != nil {
		delete(set, s)
		if len(set) == 0 {
			delete(w.subs, s.runID)
			delete(w.ended, s.runID)
		}
	}
}

func (s *Subscription) fire(sig RunSignal) {
	s.once.Do(func() {
		s.sig = sig
		close(s.done)
	})
}

// Subscribe starts watching runID. If the run is already known to have
// ended, Done is closed at once.
func (w *Watcher) Subscribe(runID string) *Subscription {
	s := &Subscription{w: w, runID: runID, done: make(chan struct{})}
	w.mu.Lock()
	defer w.mu.Unlock()
	set := w.subs[runID]
	if set == nil {
		set = map[*Subscription]struct{}{}
		w.subs[runID] = set
	}
	set[s] = struct{}{}
	if sig, ok := w.ended[runID]; ok {
		s.fire(sig)
	}
	return s
}

// deliver fires every subscriber of sig's run once.
func (w *Watcher) deliver(sig RunSignal) {
	w.mu.Lock()
	defer w.mu.Unlock()
	set := w.subs[sig.RunID]
	if set == nil {
		return // nobody here cares about that run
	}
	if _, seen := w.ended[sig.RunID]; !seen {
		w.ended[sig.RunID] = sig
	}
	first := w.ended[sig.RunID]
	for s := range set {
		s.fire(first)
	}
}

func (w *Watcher) watched() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := make([]string, 0, len(w.subs))
	for id := range w.subs {
		if _, done := w.ended[id]; !done {
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
	t := time.NewTicker(w.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := w.Poll(ctx); err != nil && ctx.Err() == nil {
				w.cfg.Logger.Warn("budget watcher: poll runs", "err", err)
			}
		}
	}
}

func (w *Watcher) listen(ctx context.Context) {
	backoff := w.cfg.MinBackoff
	for ctx.Err() == nil {
		connected := false
		err := w.src.Listen(ctx, func() {
			connected = true
			// Anything sent while we were away is gone: look now.
			if err := w.Poll(ctx); err != nil && ctx.Err() == nil {
				w.cfg.Logger.Warn("budget watcher: poll after connect", "err", err)
			}
		}, w.deliver)
		if ctx.Err() != nil {
			return
		}
		if connected {
			backoff = w.cfg.MinBackoff
		}
		w.cfg.Logger.Warn("budget watcher: listener lost, reconnecting", "err", err, "backoff", backoff)
		// Full jitter: sleep a random time up to the backoff.
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(rand.Int64N(int64(backoff)) + 1)):
		}
		backoff = min(2*backoff, w.cfg.MaxBackoff)
	}
}
