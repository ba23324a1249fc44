package llm

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"time"

	"golang.org/x/sync/semaphore"
)

// Errors of the provider models. Every error a provider returns names the
// provider and the run; match these with errors.Is.
var (
	// ErrProvider is a provider's error response (see StatusError) or a reply
	// that cannot be read.
	ErrProvider = errors.New("model provider error")
	// ErrCallTimeout is a call attempt that got no complete reply within
	// ProviderConfig.CallTimeout. Its usage is unknown.
	ErrCallTimeout = errors.New("model call timed out")
	// ErrRetriesExhausted wraps the last StatusError of a call whose retries
	// ran out: attempts, total sleep or the deadline.
	ErrRetriesExhausted = errors.New("model call retries exhausted")
	// ErrMalformedReply is a reply that does not decode (bad JSON, a stream
	// that ended before its usage). Its usage is unknown.
	ErrMalformedReply = errors.New("malformed model reply")
	// ErrMaybeBilled is a 5xx reply that is not in the provider's own error
	// shape: a gateway's page or a non-standard error body, which may come
	// after the provider ran and billed the call. Call returns it, as a
	// *StatusError, without retrying it inside the call: a caller that
	// makes the call again pays for it anew (the agent loop settles the
	// attempt at its whole reservation and reserves again).
	ErrMaybeBilled = errors.New("model call may have been billed")
)

// StatusError is a provider's HTTP error response. It holds no request, no
// headers and no key, only what is safe to log: Message has every occurrence
// of the API key removed.
type StatusError struct {
	Provider   string
	RunID      string
	StatusCode int
	// Message is the provider's error message or, if the reply was not in
	// the provider's error shape (ForeignBody), the reply's body with its
	// whitespace collapsed; redacted, at most 512 bytes.
	Message    string
	RequestID  string        // the provider's request id, if it sent one
	RetryAfter time.Duration // from Retry-After / retry-after-ms; 0 if absent
	// ForeignBody reports that the body was not in the provider's own error
	// shape (OpenAI {"error":{"message":...}}, Anthropic {"type":"error",
	// "error":{...}}): a gateway or a non-standard server answered.
	ForeignBody bool
}

func (e *StatusError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: run %s: HTTP %d %s", e.Provider, e.RunID, e.StatusCode, http.StatusText(e.StatusCode))
	if e.MaybeBilled() {
		b.WriteString(", not in the provider's error shape: the call may have been billed")
	}
	if e.Message != "" {
		fmt.Fprintf(&b, ": %s", e.Message)
	}
	if e.RequestID != "" {
		fmt.Fprintf(&b, " (request %s)", e.RequestID)
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, " (retry after %s)", e.RetryAfter)
	}
	return b.String()
}

// Unwrap makes every StatusError match ErrProvider, and one that
// MaybeBilled ErrMaybeBilled too.
func (e *StatusError) Unwrap() []error {
	if e.MaybeBilled() {
		return []error{ErrProvider, ErrMaybeBilled}
	}
	return []error{ErrProvider}
}

// MaybeBilled reports whether the reply is a 5xx not in the provider's
// error shape, which may come after the provider ran and billed the call
// (see ErrMaybeBilled).
func (e *StatusError) MaybeBilled() bool { return e.ForeignBody && e.StatusCode >= 500 }

// Retryable reports whether the reply is worth another attempt inside the
// same call: 408, 429 and 5xx, which consumed nothing, unless MaybeBilled.
// Everything else (401, 403, 400, 404, ...) will fail the same way.
func (e *StatusError) Retryable() bool {
	if e.MaybeBilled() {
		return false
	}
	return e.StatusCode == http.StatusRequestTimeout || e.StatusCode == http.StatusTooManyRequests || e.StatusCode >= 500
}

// RateLimit is a provider key's limits, as the provider states them. Zero
// RPM or TPM is unlimited.
type RateLimit struct {
	RPM int64 // requests per minute
	TPM int64 // tokens (input + output) per minute
	// Burst is how much of a minute's rate a bucket holds: capacity is
	// rate x Burst / 1m (at least one request). Default 1s, which is how
	// providers enforce per-minute limits over short windows.
	Burst time.Duration
	// Headroom is the fraction of RPM and TPM the fleet may use, in (0, 1];
	// default DefaultHeadroom. A provider's own accounting runs ahead of
	// ours (it counts tokens with its tokenizer, other clients may share
	// the key, its windows are not our bucket's), so using all of a stated
	// limit means living on 429s. Applied once, by Effective.
	Headroom float64
}

// DefaultHeadroom is RateLimit.Headroom when unset: use at most 70% of a
// provider's stated limits.
const DefaultHeadroom = 0.7

// Effective returns the limits the Limiter enforces: RPM and TPM scaled
// by Headroom (DefaultHeadroom if 0) and rounded down, with Headroom set
// to 1 so that applying Effective again changes nothing. It fails for a
// Headroom outside (0, 1] and for a limit that the headroom would round
// down to 0, which would mean unlimited.
func (l RateLimit) Effective() (RateLimit, error) {
	h := l.Headroom
	if h == 0 {
		h = DefaultHeadroom
	}
	if !(h > 0 && h <= 1) { // NaN fails too
		return l, fmt.Errorf("rate limit headroom %v: must be in (0, 1]", l.Headroom)
	}
	if l.RPM < 0 || l.TPM < 0 {
		return l, fmt.Errorf("rate limits rpm %d, tpm %d: must be >= 0", l.RPM, l.TPM)
	}
	out := l
	out.Headroom = 1
	for _, d := range []struct {
		name string
		v    *int64
	}{{"rpm", &out.RPM}, {"tpm", &out.TPM}} {
		if *d.v == 0 {
			continue
		}
		// The epsilon keeps a product that is whole in decimal (100 x
		// 0.29) from rounding down through its binary representation.
		eff := int64(math.Floor(float64(*d.v)*h + 1e-6))
		if eff < 1 {
			return l, fmt.Errorf("rate limit %s %d with headroom %v allows 0 per minute: raise the limit or the headroom", d.name, *d.v, h)
		}
		*d.v = eff
	}
	return out, nil
}

// ProviderConfig configures a provider model. Zero values take the
// documented defaults. cmd fills it from flags and the environment; nothing
// in this package reads the environment.
type ProviderConfig struct {
	// APIKey authenticates every call. It is sent only in the provider's
	// auth header: never logged, never in an error (errors have it redacted
	// even if the provider echoes it), never in a rate-limit bucket name,
	// which uses KeyID instead.
	APIKey  string
	BaseURL string // default the provider's public API
	Model   string // used when Request.Model is empty; required
	// HTTPClient sends the requests; default a client with its own transport
	// and no overall timeout (CallTimeout and ctx bound each attempt).
	HTTPClient *http.Client
	// CallTimeout bounds one attempt, from sending to the end of the reply;
	// default 2m.
	CallTimeout time.Duration
	Retry       RetryPolicy
	// Limits are the ceilings configured for the key's limits, per model
	// (0: none). Limiter enforces, before each attempt, the limits the
	// provider states for the model called (learned from its replies)
	// under these ceilings, at Effective(): Headroom below them
	// (docs/operations.md#rate-limits-and-headroom). Before a reply has
	// stated anything, the ceilings alone; with neither, nothing. Ignored
	// without a Limiter.
	Limits  RateLimit
	Limiter Limiter
	// Book receives what the replies state of the limits, for the fleet
	// (provider_limit): at most once per LearnEvery (default
	// DefaultLearnEvery) per model, and at once after a 429 or a changed
	// limit. Nil: nothing is recorded.
	Book       LimitBook
	LearnEvery time.Duration
	// Slots caps the model calls in flight on this worker; share one across
	// every provider of a worker. A call holds a slot through its retries.
	// Nil = no cap.
	Slots  *semaphore.Weighted
	Logger *slog.Logger // default slog.Default()
}

// DefaultCallTimeout bounds one attempt of one model call when
// ProviderConfig.CallTimeout is unset.
const DefaultCallTimeout = 2 * time.Minute

func (c ProviderConfig) withDefaults(provider string) (ProviderConfig, error) {
	if c.APIKey == "" {
		return c, fmt.Errorf("new %s model: an API key is required", provider)
	}
	if c.Model == "" {
		return c, fmt.Errorf("new %s model: a default model name is required", provider)
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	c.Retry = c.Retry.withDefaults()
	if c.LearnEvery <= 0 {
		c.LearnEvery = DefaultLearnEvery
	}
	if c.Limits.Burst <= 0 {
		c.Limits.Burst = time.Second
	}
	if _, err := c.Limits.Effective(); err != nil {
		return c, fmt.Errorf("new %s model: %w", provider, err)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// KeyID returns a short, stable, non-reversible id of an API key (the first
// 12 hex digits of its SHA-256), for logs and rate-limit bucket names.
func KeyID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:6])
}

// BucketName returns the name of a provider key in the fleet's records
// (provider_limit.bucket); the limiter's buckets are the key's per model
// (ModelBucket), every worker using the key sharing them.
func BucketName(provider, key string) string { return provider + ":" + KeyID(key) }

// redactor removes a key from text that may reach a log or an error.
type redactor string

func (r redactor) String(s string) string {
	if r == "" {
		return s
	}
	s = strings.ReplaceAll(s, string(r), "[REDACTED]")
	// A provider that echoes a prefix of the key ("sk-abc...xyz") leaks
	// little, but a long enough prefix still identifies it.
	if len(r) > 16 {
		s = strings.ReplaceAll(s, string(r)[:16], "[REDACTED]")
	}
	return s
}

// truncate shortens a provider message for an error.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
