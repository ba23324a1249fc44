package llm

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Stated is what one reply of a provider said of its key's rate limits
// for the model called (docs/operations.md#rate-limits-and-headroom). A
// limit it did not state is 0, what is left of a window -1, a time the
// zero time. A value out of its bound, or not in the header's shape, is
// not stated: a proxy or a hostile server cannot make the fleet trust a
// huge, negative or far-off figure.
type Stated struct {
	LimitRequests, LimitTokens         int64 // per minute
	RemainingRequests, RemainingTokens int64 // left in the provider's window
	RequestsReset, TokensReset         time.Time
	// RetryAfter is the reply's Retry-After (a 429's), within
	// maxStatedRetryAfter; 0 if none.
	RetryAfter time.Duration
}

// The bounds of what a reply may state; a value past one is ignored.
const (
	maxStatedRequests   = 100_000_000     // per minute; OpenAI's largest tiers state 30,000
	maxStatedTokens     = 100_000_000_000 // per minute; OpenAI's largest tiers state 150,000,000
	maxStatedReset      = 24 * time.Hour  // a window resets within a day (OpenAI's per-day limits)
	maxStatedRetryAfter = time.Hour
	maxHeaderLen        = 40
)

// Known reports whether the reply stated anything at all.
func (s Stated) Known() bool {
	return s.LimitRequests > 0 || s.LimitTokens > 0 || s.RemainingRequests >= 0 || s.RemainingTokens >= 0 ||
		!s.RequestsReset.IsZero() || !s.TokensReset.IsZero() || s.RetryAfter > 0
}

func unstated() Stated { return Stated{RemainingRequests: -1, RemainingTokens: -1} }

// ParseOpenAILimits reads the rate-limit headers of an OpenAI-compatible
// reply, received at now: x-ratelimit-limit-requests and -tokens (per
// minute), x-ratelimit-remaining-requests and -tokens, and
// x-ratelimit-reset-requests and -tokens, durations such as "1s", "6m0s",
// "20ms" or "1h2m3.5s" from now; and Retry-After / retry-after-ms.
func ParseOpenAILimits(h http.Header, now time.Time) Stated {
	s := unstated()
	s.LimitRequests = statedCount(h.Get("X-Ratelimit-Limit-Requests"), maxStatedRequests, 1)
	s.LimitTokens = statedCount(h.Get("X-Ratelimit-Limit-Tokens"), maxStatedTokens, 1)
	s.RemainingRequests = statedRemaining(h.Get("X-Ratelimit-Remaining-Requests"), s.LimitRequests, maxStatedRequests)
	s.RemainingTokens = statedRemaining(h.Get("X-Ratelimit-Remaining-Tokens"), s.LimitTokens, maxStatedTokens)
	s.RequestsReset = statedIn(h.Get("X-Ratelimit-Reset-Requests"), now)
	s.TokensReset = statedIn(h.Get("X-Ratelimit-Reset-Tokens"), now)
	s.RetryAfter = statedRetryAfter(h, now)
	return s
}

// ParseAnthropicLimits reads the rate-limit headers of an Anthropic reply,
// received at now: anthropic-ratelimit-requests-limit, -remaining and
// -reset (RFC 3339), and the same for tokens (the most restrictive token
// limit in effect) or, when those are absent, for input-tokens and
// output-tokens, of which the smaller limit is taken (the limiter counts
// input and output tokens against one TPM); and Retry-After.
func ParseAnthropicLimits(h http.Header, now time.Time) Stated {
	s := unstated()
	s.LimitRequests = statedCount(h.Get("Anthropic-Ratelimit-Requests-Limit"), maxStatedRequests, 1)
	s.RemainingRequests = statedRemaining(h.Get("Anthropic-Ratelimit-Requests-Remaining"), s.LimitRequests, maxStatedRequests)
	s.RequestsReset = statedAt(h.Get("Anthropic-Ratelimit-Requests-Reset"), now)
	tokens := func(prefix string) (limit, remaining int64, reset time.Time) {
		limit = statedCount(h.Get(prefix+"-Limit"), maxStatedTokens, 1)
		return limit, statedRemaining(h.Get(prefix+"-Remaining"), limit, maxStatedTokens), statedAt(h.Get(prefix+"-Reset"), now)
	}
	s.LimitTokens, s.RemainingTokens, s.TokensReset = tokens("Anthropic-Ratelimit-Tokens")
	if s.LimitTokens == 0 {
		il, ir, irs := tokens("Anthropic-Ratelimit-Input-Tokens")
		ol, or, ors := tokens("Anthropic-Ratelimit-Output-Tokens")
		switch {
		case il > 0 && (ol == 0 || il <= ol):
			s.LimitTokens, s.RemainingTokens, s.TokensReset = il, ir, irs
		case ol > 0:
			s.LimitTokens, s.RemainingTokens, s.TokensReset = ol, or, ors
		}
	}
	s.RetryAfter = statedRetryAfter(h, now)
	return s
}

// statedCount is a header's decimal count in [least, most], or 0: digits
// only, no sign, no exponent, no fraction.
func statedCount(v string, most, least int64) int64 {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > maxHeaderLen {
		return 0
	}
	for _, r := range v {
		if r < '0' || r > '9' {
			return 0
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < least || n > most {
		return 0
	}
	return n
}

// statedRemaining is what is left of a window, within [0, limit] (or
// [0, most] when no limit was stated); -1 if not stated or out of bounds.
func statedRemaining(v string, limit, most int64) int64 {
	if strings.TrimSpace(v) == "" {
		return -1
	}
	if limit > 0 {
		most = limit
	}
	if n := statedCount(v, most, 0); n > 0 || strings.TrimSpace(v) == "0" {
		return n
	}
	return -1
}

// statedIn is now plus a Go-style duration ("6m0s", "20ms"), within
// maxStatedReset; the zero time otherwise.
func statedIn(v string, now time.Time) time.Time {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > maxHeaderLen || v[0] == '-' || v[0] == '+' {
		return time.Time{}
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > maxStatedReset {
		return time.Time{}
	}
	return now.Add(d)
}

// statedAt is an RFC 3339 time within maxStatedReset of now (a reset a
// little in the past is a clock apart: kept); the zero time otherwise.
func statedAt(v string, now time.Time) time.Time {
	v = strings.TrimSpace(v)
	if v == "" || len(v) > maxHeaderLen {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil || t.Before(now.Add(-time.Minute)) || t.After(now.Add(maxStatedReset)) {
		return time.Time{}
	}
	return t
}

// statedRetryAfter is ParseRetryAfter within maxStatedRetryAfter, else 0.
func statedRetryAfter(h http.Header, now time.Time) time.Duration {
	if d := ParseRetryAfter(h, now); d > 0 && d <= maxStatedRetryAfter {
		return d
	}
	return 0
}

// reply is what the HTTP middleware saw of an attempt's reply: its status
// and headers, for the caller to learn the stated limits from (every
// reply: success, error, foreign).
type reply struct {
	mu     sync.Mutex
	status int
	header http.Header
}

type replyKey struct{}

// withReply returns ctx carrying a reply for the middleware to fill.
func withReply(ctx context.Context) (context.Context, *reply) {
	r := &reply{}
	return context.WithValue(ctx, replyKey{}, r), r
}

// noteReply keeps res's status and headers in the reply of ctx, if any.
func noteReply(ctx context.Context, res *http.Response) {
	r, _ := ctx.Value(replyKey{}).(*reply)
	if r == nil || res == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status, r.header = res.StatusCode, res.Header
}

// seen returns the status and headers noted, or ok false if no reply came.
func (r *reply) seen() (status int, h http.Header, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status, r.header, r.header != nil
}
