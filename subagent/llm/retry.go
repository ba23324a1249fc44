package llm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// RetryPolicy says when and how a provider model retries a failed attempt.
//
// The budget rule: the agent loop reserves once per Model.Call, so every
// attempt inside a Call is paid from that one reservation. An attempt is
// retried only when it provably consumed nothing: the provider answered with
// an error status (408, 429, 5xx) in its own error shape — such replies
// carry no completion and no usage — or a refusal (408, 429) in any shape.
// An attempt that got no reply (timeout, dropped connection), that failed
// mid-stream, that returned a body we cannot read, or that got a 5xx not in
// the provider's error shape (a gateway's page, a non-standard error, which
// may come after the provider ran: ErrMaybeBilled) is never retried inside
// the call, because the provider may have billed it; Call returns an error
// and the loop settles the whole reservation, flagged estimated (and, for
// ErrMaybeBilled, makes the call again under a new reservation).
// Non-retryable statuses (400, 401, 403, 404, ...) fail at once.
//
// Sleeps use full-jitter exponential backoff: attempt n sleeps a uniform
// random time in [0, min(MaxDelay, BaseDelay x 2^(n-1))]. A Retry-After
// (seconds or HTTP-date) or retry-after-ms header is a floor, never
// undercut, with jitter above it: the sleep is uniform in [RA, RA +
// min(MaxDelay, max(RA/2, the backoff ceiling))]. A provider that limits
// many callers at once tells them all the same Retry-After; without the
// spread they would all come back in the same millisecond and be refused
// together again. Spreading over half of RA keeps the expected extra wait
// at a quarter of what the provider asked for while it divides the
// returning callers' peak rate by RA/2 per caller; the backoff ceiling
// widens it for a caller refused again; MaxDelay caps it for a long RA. The number of attempts, the total sleep and the call's context
// deadline bound the retries: a retry whose sleep would end past the
// deadline is not made, and the call fails at once with ErrRetriesExhausted
// rather than sleeping into a timeout.
type RetryPolicy struct {
	MaxAttempts int           // attempts including the first; default 4; 1 disables retries
	BaseDelay   time.Duration // default 500ms
	MaxDelay    time.Duration // cap of one backoff sleep (not of Retry-After); default 30s
	MaxSleep    time.Duration // cap of the total sleep of one call; default 2m
	// JitterFunc returns a uniform random duration in [0, d]; default
	// math/rand/v2. Tests set it to make sleeps deterministic.
	JitterFunc func(d time.Duration) time.Duration
}

// DefaultRetryAttempts is RetryPolicy.MaxAttempts when unset.
const DefaultRetryAttempts = 4

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = DefaultRetryAttempts
	}
	if p.BaseDelay <= 0 {
		p.BaseDelay = 500 * time.Millisecond
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = 30 * time.Second
	}
	if p.MaxSleep <= 0 {
		p.MaxSleep = 2 * time.Minute
	}
	if p.JitterFunc == nil {
		p.JitterFunc = func(d time.Duration) time.Duration {
			if d <= 0 {
				return 0
			}
			return rand.N(d + 1)
		}
	}
	return p
}

// Backoff returns the sleep before attempt n+1 after attempt n (n >= 1)
// failed with a Retry-After of retryAfter (0 if none): never less than
// retryAfter, and spread above it (see RetryPolicy).
func (p RetryPolicy) Backoff(n int, retryAfter time.Duration) time.Duration {
	p = p.withDefaults()
	ceiling := p.MaxDelay
	if n-1 < 30 {
		ceiling = min(p.MaxDelay, p.BaseDelay<<(n-1))
	}
	if retryAfter <= 0 {
		return p.JitterFunc(ceiling)
	}
	spread := min(p.MaxDelay, max(retryAfter/2, ceiling))
	return retryAfter + min(max(0, p.JitterFunc(spread)), spread)
}

// ParseRetryAfter reads a reply's retry delay: retry-after-ms (OpenAI), or
// Retry-After as delay-seconds or an HTTP-date (RFC 9110 10.2.3). It returns
// 0 if there is none or it cannot be read.
func ParseRetryAfter(h http.Header, now time.Time) time.Duration {
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms > 0 {
			return time.Duration(ms * float64(time.Millisecond))
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(s * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, t.Sub(now))
	}
	return 0
}

// caller is what both providers share: the per-worker slot, the fleet rate
// limits (configured, and learned from the replies), the per-attempt
// timeout, retries and key redaction.
type caller struct {
	provider  string
	cfg       ProviderConfig
	keyBucket string // BucketName of the key
	redact    redactor
	parse     func(http.Header, time.Time) Stated

	mu     sync.Mutex
	models map[string]*modelLimits // by model called, at most maxModels
	others *modelLimits            // the calls of models past them; nil until one
}

func newCaller(provider string, cfg ProviderConfig, parse func(http.Header, time.Time) Stated) *caller {
	return &caller{provider: provider, cfg: cfg, keyBucket: BucketName(provider, cfg.APIKey), redact: redactor(cfg.APIKey),
		parse: parse, models: map[string]*modelLimits{}}
}

// errAttemptTimeout is the cause of an attempt's context when CallTimeout passes.
var errAttemptTimeout = errors.New("attempt timeout")

// do runs attempt under the slot, the limits and the retry policy. attempt
// returns a *StatusError for an error reply and other errors already
// redacted and naming the provider. extraInput is what the provider adds
// to the request's input (a structured-output schema); a req.InputBound
// covers it already.
func (c *caller) do(ctx context.Context, req Request, extraInput int64, attempt func(context.Context) (Response, error)) (Response, error) {
	if err := context.Cause(ctx); err != nil {
		return Response{}, err
	}
	if req.MaxTokens < 1 {
		return Response{}, fmt.Errorf("%s: run %s: max tokens %d: must be >= 1", c.provider, req.Meta.RunID, req.MaxTokens)
	}
	if c.cfg.Slots != nil {
		queued := time.Now()
		if err := c.cfg.Slots.Acquire(ctx, 1); err != nil {
			return Response{}, context.Cause(ctx)
		}
		addWait(ctx, time.Since(queued))
		defer c.cfg.Slots.Release(1)
	}
	// What a call may cost at most: the input bound the caller reserved (or,
	// if it gave none, InputBound of the request and the extra input) plus
	// the whole output allowance. The rate limiter debits this before the
	// call and refunds the difference once the real usage is known.
	input := req.InputBound
	if input <= 0 {
		input = InputBound(req.Messages, req.Tools...) + extraInput
	}
	cost := input + int64(req.MaxTokens)
	model := req.Model
	if model == "" {
		model = c.cfg.Model
	}
	log := c.cfg.Logger.With("provider", c.provider, "key_id", KeyID(c.cfg.APIKey),
		"run_id", req.Meta.RunID, "task_id", req.Meta.TaskID, "iteration", req.Meta.Iteration)
	var slept time.Duration
	for n := 1; ; n++ {
		bucket, err := c.take(ctx, req.Meta.RunID, model, cost)
		if err != nil {
			return Response{}, err
		}
		actx, cancel := context.WithTimeoutCause(ctx, c.cfg.CallTimeout, errAttemptTimeout)
		actx, rep := withReply(actx)
		resp, err := attempt(actx)
		timedOut := errors.Is(context.Cause(actx), errAttemptTimeout)
		cancel()
		c.recordAttempt(ctx, err, timedOut)
		if status, h, ok := rep.seen(); ok {
			c.learn(ctx, model, status, h) // every reply states its limits, an error's too
		}
		if err == nil {
			c.recordUse(ctx, model, resp.Usage.Total())
			c.refund(ctx, bucket, cost-resp.Usage.Total())
			return resp, nil
		}
		var se *StatusError
		if !errors.As(err, &se) || se.MaybeBilled() || ctx.Err() != nil || timedOut {
			c.recordUse(ctx, model, cost) // usage unknown: its cost stays taken
		} else {
			c.recordUse(ctx, model, 0)
		}
		if ctx.Err() != nil {
			return Response{}, context.Cause(ctx)
		}
		if timedOut {
			return Response{}, fmt.Errorf("%s: run %s: no complete reply within %s: %w",
				c.provider, req.Meta.RunID, c.cfg.CallTimeout, ErrCallTimeout)
		}
		if se == nil || se.MaybeBilled() {
			return Response{}, err // usage unknown: never retried, and its cost stays taken
		}
		c.refund(ctx, bucket, cost) // an error reply in the provider's shape consumed no tokens
		if se.StatusCode == http.StatusTooManyRequests {
			c.recordRateLimited(ctx, req.Meta)
		}
		if !se.Retryable() {
			return Response{}, err
		}
		delay, why := c.cfg.Retry.Next(ctx, n, slept, se.RetryAfter)
		if why != "" {
			return Response{}, fmt.Errorf("%w after %s: %w", ErrRetriesExhausted, why, err)
		}
		log.WarnContext(ctx, "model call retried", "status", se.StatusCode, "attempt", n, "sleep", delay, "retry_after", se.RetryAfter)
		slept0 := time.Now()
		err = Sleep(ctx, delay)
		if se.StatusCode == http.StatusTooManyRequests {
			c.recordWait(ctx, waitProvider, time.Since(slept0))
		}
		if err != nil {
			return Response{}, err
		}
		slept += delay
	}
}

// Next returns how long to sleep before attempt n+1 after attempt n
// failed with a Retry-After of retryAfter, having slept slept already, or,
// with a zero delay, why no attempt follows: MaxAttempts, MaxSleep or ctx's
// deadline would be passed.
func (p RetryPolicy) Next(ctx context.Context, n int, slept, retryAfter time.Duration) (time.Duration, string) {
	p = p.withDefaults()
	delay := p.Backoff(n, retryAfter)
	switch deadline, ok := ctx.Deadline(); {
	case n >= p.MaxAttempts:
		return 0, fmt.Sprintf("%d attempts", n)
	case slept+delay > p.MaxSleep:
		return 0, fmt.Sprintf("sleeping %s more would pass the %s retry budget", delay.Round(time.Millisecond), p.MaxSleep)
	case ok && time.Now().Add(delay).After(deadline):
		return 0, fmt.Sprintf("sleeping %s would pass the deadline", delay.Round(time.Millisecond))
	}
	return delay, ""
}

// Sleep waits d or until ctx ends, returning its cause.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
