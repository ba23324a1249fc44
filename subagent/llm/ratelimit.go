package llm

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// Limiter holds token buckets, one per provider key, that every attempt
// debits before it is sent. store.RateLimiter implements it on PostgreSQL,
// shared by the fleet; MemoryLimiter in one process. Its methods use only
// standard types so that implementations need not import this package.
type Limiter interface {
	// Define sets bucket's limits, creating the bucket (empty) if needed.
	// rpm or tpm 0 means that dimension is unlimited; burst is how much of a
	// minute's rate the bucket holds.
	Define(ctx context.Context, bucket string, rpm, tpm int64, burst time.Duration) error
	// Take debits requests and tokens from bucket if its balances, refilled
	// to now, cover them (a debit larger than the bucket's capacity needs a
	// full bucket and leaves it in debt). Otherwise it debits nothing and
	// returns how long to wait before the balances could cover it. Concurrent
	// takes never pass on the same balance. It fails if the bucket is not
	// defined.
	Take(ctx context.Context, bucket string, requests, tokens int64) (wait time.Duration, err error)
	// Refund credits tokens back to bucket (a negative refund debits more),
	// when a call turns out to cost less (or more) than was taken.
	Refund(ctx context.Context, bucket string, tokens int64) error
}

// take waits until the limiter grants one request and tokens from the
// bucket of model, or ctx ends. It returns the bucket it took from, or ""
// when no limit of model is known (none configured, none stated yet):
// then it takes nothing.
func (c *caller) take(ctx context.Context, runID, model string, tokens int64) (string, error) {
	l := c.cfg.Limiter
	if l == nil {
		return "", nil
	}
	bucket, err := c.define(ctx, model)
	if err != nil {
		if ctx.Err() != nil {
			return "", context.Cause(ctx)
		}
		return "", fmt.Errorf("%s: run %s: define rate limits of model %s: %w", c.provider, runID, model, err)
	}
	if bucket == "" {
		return "", nil
	}
	start := time.Now()
	defer func() { c.recordWait(ctx, waitLimiter, time.Since(start)) }()
	for {
		wait, err := l.Take(ctx, bucket, 1, tokens)
		if err != nil {
			if ctx.Err() != nil {
				return "", context.Cause(ctx)
			}
			return "", fmt.Errorf("%s: run %s: take %d tokens from rate limit bucket %s: %w", c.provider, runID, tokens, bucket, err)
		}
		if wait <= 0 {
			return bucket, nil
		}
		// A little jitter keeps waiting callers from arriving together.
		wait += rand.N(wait/4 + time.Millisecond)
		if err := Sleep(ctx, wait); err != nil {
			return "", err
		}
	}
}

// define makes sure model's bucket holds the limits known now (the
// stated ones under the configured ceilings, times the headroom) and
// returns it; "" when no limit is known.
func (c *caller) define(ctx context.Context, model string) (string, error) {
	c.mu.Lock()
	m := c.limitsOf(model, time.Now())
	want := c.ceilings(m)
	bucket, done := m.bucket, m.defined && m.definedAs == want
	c.mu.Unlock()
	if want.RPM == 0 && want.TPM == 0 {
		return "", nil
	}
	if done {
		return bucket, nil
	}
	// The headroom is applied here and only here: the Limiter enforces
	// what it is given.
	lim, err := atLeastOne(want).Effective()
	if err != nil {
		return "", err
	}
	if err := c.cfg.Limiter.Define(ctx, bucket, lim.RPM, lim.TPM, lim.Burst); err != nil {
		return "", err
	}
	c.mu.Lock()
	// A reading that changed the limits while Define ran leaves the
	// bucket to be defined again by the next take.
	if c.ceilings(m) == want {
		m.defined, m.definedAs = true, want
	}
	stated := RateLimit{RPM: m.rpm, TPM: m.tpm}
	c.mu.Unlock()
	c.recordLimits(ctx, m.metricModel, stated, c.cfg.Limits, lim)
	return bucket, nil
}

// atLeastOne raises each limit of want that its headroom would round
// down to 0 a minute (a stated 1 RPM at 0.7) to the least that it keeps
// at 1: a provider stating a tiny limit slows the calls to 1 a minute,
// never refuses them all (the next reply could correct it) nor makes the
// bucket unlimited. The configured ceilings are checked when the provider
// is made; only a stated limit can be that low.
func atLeastOne(want RateLimit) RateLimit {
	h := want.Headroom
	if h == 0 {
		h = DefaultHeadroom
	}
	if !(h > 0 && h <= 1) {
		return want // Effective says why
	}
	least := int64(math.Ceil(1 / h))
	for _, v := range []*int64{&want.RPM, &want.TPM} {
		if *v > 0 && *v < least {
			*v = least
		}
	}
	return want
}

// ceilings are the limits of m before the headroom: each stated limit
// under its configured ceiling, whichever is known (0: neither).
// The other models' (c.others) state nothing of their own: theirs is the
// smallest limit stated for any kept model, never none. Hold c.mu.
func (c *caller) ceilings(m *modelLimits) RateLimit {
	rpm, tpm := m.rpm, m.tpm
	if m == c.others {
		rpm, tpm = c.smallestStated()
	}
	out := c.cfg.Limits
	out.RPM = ceiling(rpm, c.cfg.Limits.RPM)
	out.TPM = ceiling(tpm, c.cfg.Limits.TPM)
	return out
}

// ceiling is the stated limit under the configured one, whichever is
// known; 0 when neither is.
func ceiling(stated, configured int64) int64 {
	switch {
	case stated <= 0:
		return configured
	case configured <= 0:
		return stated
	}
	return min(stated, configured)
}

// refund credits tokens back to bucket, best effort: a failed refund only
// makes the limiter stricter than it needs to be. No bucket: nothing was
// taken.
func (c *caller) refund(ctx context.Context, bucket string, tokens int64) {
	if c.cfg.Limiter == nil || bucket == "" || tokens == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := c.cfg.Limiter.Refund(rctx, bucket, tokens); err != nil {
		c.cfg.Logger.WarnContext(ctx, "refund rate limit tokens", "provider", c.provider, "bucket", bucket, "tokens", tokens, "err", err)
	}
}

// MemoryLimiter is a Limiter for one process: a dev server, a single worker
// or tests. A fleet shares store.RateLimiter instead. Safe for concurrent use.
type MemoryLimiter struct {
	mu      sync.Mutex
	buckets map[string]*memBucket
	now     func() time.Time
}

type memBucket struct {
	rpm, tpm         int64
	burst            time.Duration
	requests, tokens float64
	at               time.Time
}

var _ Limiter = (*MemoryLimiter)(nil)

// NewMemoryLimiter returns an empty MemoryLimiter.
func NewMemoryLimiter() *MemoryLimiter {
	return &MemoryLimiter{buckets: map[string]*memBucket{}, now: time.Now}
}

// Define implements Limiter.
func (m *MemoryLimiter) Define(_ context.Context, bucket string, rpm, tpm int64, burst time.Duration) error {
	if rpm < 0 || tpm < 0 || burst <= 0 {
		return fmt.Errorf("define bucket %s: rpm %d, tpm %d, burst %s: limits must be >= 0 and burst > 0", bucket, rpm, tpm, burst)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.buckets[bucket]
	if b == nil {
		b = &memBucket{at: m.now()}
		m.buckets[bucket] = b
	}
	m.refill(b)
	b.rpm, b.tpm, b.burst = rpm, tpm, burst
	return nil
}

// Take implements Limiter.
func (m *MemoryLimiter) Take(_ context.Context, bucket string, requests, tokens int64) (time.Duration, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.buckets[bucket]
	if b == nil {
		return 0, fmt.Errorf("take from bucket %s: not defined", bucket)
	}
	m.refill(b)
	wr := need(b.requests, float64(requests), b.rpm, b.burst)
	wt := need(b.tokens, float64(tokens), b.tpm, b.burst)
	if w := max(wr, wt); w > 0 {
		return w, nil
	}
	if b.rpm > 0 {
		b.requests -= float64(requests)
	}
	if b.tpm > 0 {
		b.tokens -= float64(tokens)
	}
	return 0, nil
}

// Refund implements Limiter.
func (m *MemoryLimiter) Refund(_ context.Context, bucket string, tokens int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.buckets[bucket]
	if b == nil {
		return fmt.Errorf("refund to bucket %s: not defined", bucket)
	}
	m.refill(b)
	if b.tpm > 0 {
		b.tokens = min(capacity(b.tpm, b.burst), b.tokens+float64(tokens))
	}
	return nil
}

func (m *MemoryLimiter) refill(b *memBucket) {
	now := m.now()
	el := max(0, now.Sub(b.at).Minutes())
	if now.After(b.at) {
		b.at = now
	}
	b.requests = min(capacity(b.rpm, b.burst), b.requests+float64(b.rpm)*el)
	b.tokens = min(capacity(b.tpm, b.burst), b.tokens+float64(b.tpm)*el)
}

// capacity is what a bucket of perMinute with burst holds: at least 1.
func capacity(perMinute int64, burst time.Duration) float64 {
	return max(1, float64(perMinute)*burst.Minutes())
}

// need returns how long until balance covers n (capped at the capacity), or
// 0 if it does now or the dimension is unlimited.
func need(balance, n float64, perMinute int64, burst time.Duration) time.Duration {
	if perMinute <= 0 {
		return 0
	}
	want := min(n, capacity(perMinute, burst))
	if balance >= want {
		return 0
	}
	return time.Duration((want - balance) / float64(perMinute) * float64(time.Minute))
}
