package orchestrator

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// rateReads is an engine's one view of the rate limits, per provider and
// model (docs/operations.md#concurrency-from-the-rate-limits): while runs
// of the engine are sized from a limit, one goroutine reads it (the stated
// limits and the count of the runs sharing them) once per interval,
// whatever the number of those runs, and keeps the last value. A run's
// drive loop takes that value and never waits on a read.
type rateReads struct {
	src      RateLimits
	interval time.Duration
	log      *slog.Logger
	base     context.Context // the engine's lifetime
	loops    sync.WaitGroup  // the reading goroutines

	mu    sync.Mutex
	byKey map[rateKey]*rateRead
}

type rateKey struct{ provider, model string }

// rateRead is what is known of one provider and model's limits.
type rateRead struct {
	limit RateLimit
	gen   uint64    // reads that succeeded; 0: none yet
	at    time.Time // when the last read that succeeded began
	// reading is closed when the read in progress ends (nil: none).
	reading chan struct{}
	// users: the runs sized from it now; stop ends their reading loop.
	users int
	stop  context.CancelFunc
}

func newRateReads(base context.Context, src RateLimits, interval time.Duration, log *slog.Logger) *rateReads {
	return &rateReads{src: src, interval: interval, log: log, base: base, byKey: map[rateKey]*rateRead{}}
}

func (c *rateReads) entry(k rateKey) *rateRead {
	r, ok := c.byKey[k]
	if !ok {
		r = &rateRead{}
		c.byKey[k] = r
	}
	return r
}

// last returns the last value read of provider and model's limits and its
// generation (0: none read yet), without waiting.
func (c *rateReads) last(provider, model string) (RateLimit, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.entry(rateKey{provider, model})
	return r.limit, r.gen
}

// read returns provider and model's limits no older than an interval: the
// last value, or a new read's (one at a time: a caller that finds a read in
// progress waits for it). ok false: the read failed (logged) and nothing
// fresh is known. gen is the value's generation, as last returns it. For a
// run that is being created or adopted, before its drive loop.
func (c *rateReads) read(ctx context.Context, provider, model string) (l RateLimit, gen uint64, ok bool) {
	k := rateKey{provider, model}
	for {
		c.mu.Lock()
		r := c.entry(k)
		switch {
		case r.gen > 0 && time.Since(r.at) < c.interval:
			l, gen = r.limit, r.gen
			c.mu.Unlock()
			return l, gen, true
		case r.reading != nil:
			wait := r.reading
			c.mu.Unlock()
			select {
			case <-wait:
			case <-ctx.Done():
				return RateLimit{}, 0, false
			}
		default:
			r.reading = make(chan struct{})
			c.mu.Unlock()
			return c.finish(ctx, k, r)
		}
	}
}

// finish reads k's limits into r, whose read the caller began (r.reading
// set), and ends the read.
func (c *rateReads) finish(ctx context.Context, k rateKey, r *rateRead) (RateLimit, uint64, bool) {
	began := time.Now()
	l, err := c.src.RateLimits(ctx, k.provider, k.model)
	c.mu.Lock()
	defer c.mu.Unlock()
	close(r.reading)
	r.reading = nil
	if err != nil {
		c.log.WarnContext(ctx, "read the rate limits to size runs' concurrency; keeping the last",
			"provider", k.provider, "model", k.model, "err", err)
		return RateLimit{}, 0, false
	}
	r.limit, r.at = l, began
	r.gen++
	return l, r.gen, true
}

// use marks a run sized from provider and model's limits until release is
// called: the first user starts the loop that reads them every interval,
// the last one's release stops it.
func (c *rateReads) use(provider, model string) (release func()) {
	k := rateKey{provider, model}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweep()
	r := c.entry(k)
	r.users++
	if r.users == 1 {
		ctx, stop := context.WithCancel(c.base)
		r.stop = stop
		c.loops.Go(func() { c.loop(ctx, k) })
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if r.users--; r.users == 0 {
				r.stop()
				r.stop = nil
			}
		})
	}
}

// sweep forgets the limits no run has used for ten intervals (a model
// name a spec made up is not kept for ever). c.mu is held.
func (c *rateReads) sweep() {
	for k, r := range c.byKey {
		if r.users == 0 && r.reading == nil && time.Since(r.at) > 10*c.interval {
			delete(c.byKey, k)
		}
	}
}

// loop reads k's limits every interval (at once unless a read of the last
// interval is known) until ctx ends.
func (c *rateReads) loop(ctx context.Context, k rateKey) {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		// Read unless a read began less than half an interval ago (a new
		// run's) or one is in progress.
		c.mu.Lock()
		r := c.entry(k)
		begin := r.reading == nil && (r.gen == 0 || time.Since(r.at) >= c.interval/2)
		if begin {
			r.reading = make(chan struct{})
		}
		c.mu.Unlock()
		if begin {
			rctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
			c.finish(rctx, k, r)
			cancel()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// wait waits for the reading loops to end (after every run has released
// its limits, or the engine's base context ended).
func (c *rateReads) wait() { c.loops.Wait() }
