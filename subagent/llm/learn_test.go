package llm_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/fanout/fanout/subagent/llm"
	"github.com/fanout/fanout/subagent/llm/llmtest"
)

// TestParseStatedLimits reads the headers in the shapes the providers
// send (OpenAI's and Anthropic's rate-limit documentation) and ignores
// values a proxy or a hostile server could send to make the fleet trust
// a huge, negative or far-off figure.
func TestParseStatedLimits(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 7, 4, 0, 0, 0, time.UTC)
	unstated := llm.Stated{RemainingRequests: -1, RemainingTokens: -1}
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	for _, c := range []struct {
		name  string
		parse func(http.Header, time.Time) llm.Stated
		h     http.Header
		want  llm.Stated
	}{
		{"openai", llm.ParseOpenAILimits, hdr(
			"x-ratelimit-limit-requests", "5000", "x-ratelimit-limit-tokens", "160000",
			"x-ratelimit-remaining-requests", "4999", "x-ratelimit-remaining-tokens", "159976",
			"x-ratelimit-reset-requests", "12ms", "x-ratelimit-reset-tokens", "6m0s"),
			llm.Stated{LimitRequests: 5000, LimitTokens: 160000, RemainingRequests: 4999, RemainingTokens: 159976,
				RequestsReset: now.Add(12 * time.Millisecond), TokensReset: now.Add(6 * time.Minute)}},
		{"openai long reset and retry-after", llm.ParseOpenAILimits, hdr(
			"x-ratelimit-limit-requests", "60", "x-ratelimit-remaining-requests", "0",
			"x-ratelimit-reset-requests", "1h2m3.5s", "retry-after", "20"),
			llm.Stated{LimitRequests: 60, RemainingRequests: 0, RemainingTokens: -1,
				RequestsReset: now.Add(time.Hour + 2*time.Minute + 3500*time.Millisecond), RetryAfter: 20 * time.Second}},
		{"anthropic", llm.ParseAnthropicLimits, hdr(
			"anthropic-ratelimit-requests-limit", "50", "anthropic-ratelimit-requests-remaining", "49",
			"anthropic-ratelimit-requests-reset", "2026-12-07T04:00:01Z",
			"anthropic-ratelimit-tokens-limit", "40000", "anthropic-ratelimit-tokens-remaining", "39000",
			"anthropic-ratelimit-tokens-reset", "2026-12-07T04:00:02Z",
			"anthropic-ratelimit-input-tokens-limit", "30000", "anthropic-ratelimit-output-tokens-limit", "8000"),
			llm.Stated{LimitRequests: 50, LimitTokens: 40000, RemainingRequests: 49, RemainingTokens: 39000,
				RequestsReset: now.Add(time.Second), TokensReset: now.Add(2 * time.Second)}},
		{"anthropic input and output only: the smaller", llm.ParseAnthropicLimits, hdr(
			"anthropic-ratelimit-input-tokens-limit", "30000", "anthropic-ratelimit-input-tokens-remaining", "29000",
			"anthropic-ratelimit-output-tokens-limit", "8000", "anthropic-ratelimit-output-tokens-remaining", "7000",
			"anthropic-ratelimit-output-tokens-reset", "2026-12-07T04:00:03Z", "retry-after", "5"),
			llm.Stated{LimitTokens: 8000, RemainingRequests: -1, RemainingTokens: 7000,
				TokensReset: now.Add(3 * time.Second), RetryAfter: 5 * time.Second}},
		{"hostile openai", llm.ParseOpenAILimits, hdr(
			"x-ratelimit-limit-requests", "99999999999999999999", "x-ratelimit-limit-tokens", "-5",
			"x-ratelimit-remaining-requests", "1e9", "x-ratelimit-remaining-tokens", "0x10",
			"x-ratelimit-reset-requests", "-1s", "x-ratelimit-reset-tokens", "9999h", "retry-after", "-3"),
			unstated},
		{"hostile openai past the bounds", llm.ParseOpenAILimits, hdr(
			"x-ratelimit-limit-requests", "100000001", "x-ratelimit-limit-tokens", "100000000001",
			"x-ratelimit-remaining-requests", "+5", "x-ratelimit-reset-requests", "25h", "retry-after", "86400"),
			unstated},
		{"remaining over the limit", llm.ParseOpenAILimits, hdr(
			"x-ratelimit-limit-requests", "60", "x-ratelimit-remaining-requests", "61"),
			llm.Stated{LimitRequests: 60, RemainingRequests: -1, RemainingTokens: -1}},
		{"hostile anthropic", llm.ParseAnthropicLimits, hdr(
			"anthropic-ratelimit-requests-limit", "0", "anthropic-ratelimit-requests-remaining", "-1",
			"anthropic-ratelimit-requests-reset", "2099-01-01T00:00:00Z",
			"anthropic-ratelimit-tokens-limit", "4 0000", "anthropic-ratelimit-tokens-reset", "2020-01-01T00:00:00Z",
			"anthropic-ratelimit-input-tokens-limit", "NaN", "anthropic-ratelimit-output-tokens-limit", "1.5"),
			unstated},
		{"none", llm.ParseOpenAILimits, http.Header{}, unstated},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got := c.parse(c.h, now)
			if !got.RequestsReset.Equal(c.want.RequestsReset) || !got.TokensReset.Equal(c.want.TokensReset) {
				t.Errorf("resets = %v, %v; want %v, %v", got.RequestsReset, got.TokensReset, c.want.RequestsReset, c.want.TokensReset)
			}
			got.RequestsReset, got.TokensReset, c.want.RequestsReset, c.want.TokensReset = time.Time{}, time.Time{}, time.Time{}, time.Time{}
			if got != c.want {
				t.Errorf("got %+v\nwant %+v", got, c.want)
			}
			if c.want == unstated && got.Known() {
				t.Errorf("%+v: Known, want nothing stated", got)
			}
		})
	}
}

// defineLog is a Limiter that records every Define.
type defineLog struct {
	*llm.MemoryLimiter
	mu      sync.Mutex
	defines []defined
}

type defined struct {
	bucket   string
	rpm, tpm int64
}

func (d *defineLog) Define(ctx context.Context, bucket string, rpm, tpm int64, burst time.Duration) error {
	d.mu.Lock()
	d.defines = append(d.defines, defined{bucket, rpm, tpm})
	d.mu.Unlock()
	return d.MemoryLimiter.Define(ctx, bucket, rpm, tpm, burst)
}

func (d *defineLog) all() []defined {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]defined(nil), d.defines...)
}

// book is a LimitBook that keeps every write.
type book struct {
	mu     sync.Mutex
	writes []llm.Learned
}

func (b *book) Learn(_ context.Context, l llm.Learned) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.writes = append(b.writes, l)
	return nil
}

func (b *book) all() []llm.Learned {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]llm.Learned(nil), b.writes...)
}

// TestProviderEnforcesLearnedLimitsUnderHeadroom: a provider that states
// its limits (the in-repo servers, in each provider's header shapes) has
// them enforced, times the headroom, from the next attempt on, in the
// bucket of its key and model; a configured ceiling below a stated limit
// wins; before any reply nothing is known and nothing is taken.
func TestProviderEnforcesLearnedLimitsUnderHeadroom(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		for _, c := range []struct {
			name       string
			configured llm.RateLimit
			want       defined // rpm, tpm: the limits Defined once learned
		}{
			// Stated 6,000 RPM and 600,000 TPM at headroom 0.5.
			{"stated", llm.RateLimit{}, defined{rpm: 3000, tpm: 300_000}},
			// A ceiling of 1,000 RPM under the stated 6,000: 500.
			{"configured ceiling wins", llm.RateLimit{RPM: 1000}, defined{rpm: 500, tpm: 300_000}},
		} {
			t.Run(k.name+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				lim := &defineLog{MemoryLimiter: llm.NewMemoryLimiter()}
				b := &book{}
				f := newFixtureOn(t, k, llmtest.Config{Limits: llm.RateLimit{RPM: 6000, TPM: 600_000, Burst: time.Minute}},
					func(pc *llm.ProviderConfig) {
						pc.Limiter, pc.Book, pc.LearnEvery = lim, b, time.Hour
						pc.Limits = c.configured
						pc.Limits.Headroom = 0.5
						pc.Limits.Burst = time.Minute // the bucket holds a minute: no waits here
					})
				for range 2 {
					if _, err := f.call(t.Context(), providerRequest()); err != nil {
						t.Fatal(err)
					}
				}
				bucket := llm.ModelBucket(k.provider, canary, "test-model")
				c.want.bucket = bucket
				got := lim.all()
				if len(got) == 0 || got[len(got)-1] != c.want {
					t.Fatalf("Defines = %+v, want the last %+v: min(stated, configured) x headroom", got, c.want)
				}
				if c.configured.RPM == 0 && len(got) != 1 {
					t.Errorf("Defines = %+v: before the first reply nothing is known, so nothing is defined", got)
				}
				w := b.all()
				if len(w) != 1 {
					t.Fatalf("book writes = %+v, want 1 (the first reading; the second is within LearnEvery)", w)
				}
				l := w[0]
				if l.Bucket != llm.BucketName(k.provider, canary) || l.Provider != k.provider || l.Model != "test-model" || !l.ModelDefault {
					t.Errorf("learned %+v: want the key's bucket, the provider, the default model", l)
				}
				if l.LimitRequests != 6000 || l.LimitTokens != 600_000 || l.ConfiguredRPM != c.configured.RPM {
					t.Errorf("learned %+v: want 6000 RPM, 600000 TPM stated, configured %d RPM", l, c.configured.RPM)
				}
				if l.RemainingRequests < 0 || l.RemainingTokens < 0 || l.RequestsResetAt.IsZero() || l.TokensResetAt.IsZero() {
					t.Errorf("learned %+v: want what is left and the resets", l)
				}
			})
		}
	}
}

// TestProviderLearnsA429AtOnce: a 429 with retry-after is written to the
// book at once, with its retry-after, though a write was made within
// LearnEvery; a changed limit is written at once too; other readings wait
// for LearnEvery (no write per call).
func TestProviderLearnsA429AtOnce(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			b := &book{}
			f := newFixture(t, k, func(r llmtest.Request) llmtest.Reply {
				limit := "1000"
				if r.N > 4 {
					limit = "2000"
				}
				h := http.Header{"X-Ratelimit-Limit-Requests": {limit}, "Anthropic-Ratelimit-Requests-Limit": {limit}}
				if r.N == 2 {
					return llmtest.Reply{Status: http.StatusTooManyRequests, RetryAfter: "1", Header: h}
				}
				return llmtest.Reply{Text: "ok", Header: h}
			}, func(pc *llm.ProviderConfig) {
				pc.Book, pc.LearnEvery = b, time.Hour
			})
			start := time.Now()
			for range 5 { // replies 1, 2 (429), 3, 4, 5 (2000), 6
				if _, err := f.call(t.Context(), providerRequest()); err != nil {
					t.Fatal(err)
				}
			}
			w := b.all()
			if len(w) != 3 {
				t.Fatalf("%d writes for 6 replies, want 3 (the first limit, the 429, the changed limit): %+v", len(w), w)
			}
			if w[0].LimitRequests != 1000 || w[0].Throttled != 0 {
				t.Errorf("first write %+v, want 1000 RPM and no 429", w[0])
			}
			if w[1].Throttled != 1 || w[1].ThrottledUntil.Before(start.Add(time.Second)) || w[1].ThrottledUntil.After(time.Now().Add(time.Second)) {
				t.Errorf("429's write %+v: want 1 throttled until about a second after it", w[1])
			}
			if w[2].LimitRequests != 2000 || w[2].Throttled != 0 {
				t.Errorf("last write %+v, want the new 2000 RPM and no new 429", w[2])
			}
		})
	}
}

// TestProviderIgnoresHostileLimits: replies stating garbage define no
// bucket and write nothing.
func TestProviderIgnoresHostileLimits(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			lim := &defineLog{MemoryLimiter: llm.NewMemoryLimiter()}
			b := &book{}
			f := newFixture(t, k, func(llmtest.Request) llmtest.Reply {
				return llmtest.Reply{Text: "ok", Header: http.Header{
					"X-Ratelimit-Limit-Requests": {"-1"}, "X-Ratelimit-Limit-Tokens": {"1e12"},
					"Anthropic-Ratelimit-Requests-Limit": {"99999999999999999999"}, "Anthropic-Ratelimit-Tokens-Limit": {"0"},
					"X-Ratelimit-Reset-Requests": {"-5s"}, "Anthropic-Ratelimit-Requests-Reset": {"yesterday"},
				}}
			}, func(pc *llm.ProviderConfig) {
				pc.Limiter, pc.Book = lim, b
			})
			for range 2 {
				if _, err := f.call(t.Context(), providerRequest()); err != nil {
					t.Fatal(err)
				}
			}
			if d := lim.all(); len(d) != 0 {
				t.Errorf("Defines = %+v, want none: nothing believable was stated", d)
			}
			if w := b.all(); len(w) != 0 {
				t.Errorf("book writes = %+v, want none", w)
			}
		})
	}
}

// grantAll is a defineLog whose every Take is granted at once: a test of
// what is defined needs no wait for a bucket of 1 a minute.
type grantAll struct{ *defineLog }

func (grantAll) Take(context.Context, string, int64, int64) (time.Duration, error) { return 0, nil }

// statingRPM is a reply header stating rpm requests a minute in both
// providers' shapes.
func statingRPM(rpm string) http.Header {
	return http.Header{"X-Ratelimit-Limit-Requests": {rpm}, "Anthropic-Ratelimit-Requests-Limit": {rpm},
		"X-Ratelimit-Limit-Tokens": {rpm}, "Anthropic-Ratelimit-Tokens-Limit": {rpm}}
}

// TestProviderTinyStatedLimitStillCalls: a reply stating 1 RPM and 1 TPM,
// which the headroom (0.7) rounds down to 0, is enforced at 1 a minute:
// the next calls are sent (and their replies can correct it), never
// refused before they are sent.
func TestProviderTinyStatedLimitStillCalls(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			lim := grantAll{&defineLog{MemoryLimiter: llm.NewMemoryLimiter()}}
			f := newFixture(t, k, func(r llmtest.Request) llmtest.Reply {
				if r.N == 1 {
					return llmtest.Reply{Text: "ok", Header: statingRPM("1")}
				}
				return llmtest.Reply{Text: "ok", Header: statingRPM("6000")}
			}, func(pc *llm.ProviderConfig) { pc.Limiter = lim })
			for i := range 3 {
				if _, err := f.call(t.Context(), providerRequest()); err != nil {
					t.Fatalf("call %d: %v", i+1, err)
				}
			}
			if n := len(f.srv.Requests()); n != 3 {
				t.Errorf("server saw %d requests, want 3", n)
			}
			bucket := llm.ModelBucket(k.provider, canary, "test-model")
			want := []defined{{bucket, 1, 1}, {bucket, 4200, 4200}}
			if got := lim.all(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
				t.Errorf("Defines = %+v, want %+v: 1 a minute for the stated 1, then 6000 x 0.7", got, want)
			}
		})
	}
}

// TestProviderModelTableSurvivesTenantModels: calls naming models the
// provider does not serve (a tenant's free-form spec, replies stating
// nothing) do not keep a worker from learning the models it does serve.
func TestProviderModelTableSurvivesTenantModels(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			lim := grantAll{&defineLog{MemoryLimiter: llm.NewMemoryLimiter()}}
			f := newFixture(t, k, func(r llmtest.Request) llmtest.Reply {
				if r.Model != "test-model" {
					return llmtest.Reply{Status: http.StatusNotFound, Message: "no such model"}
				}
				return llmtest.Reply{Text: "ok", Header: statingRPM("600")}
			}, func(pc *llm.ProviderConfig) { pc.Limiter = lim })
			for i := range 100 {
				req := providerRequest()
				req.Model = fmt.Sprintf("bogus-%d", i)
				if _, err := f.call(t.Context(), req); err == nil {
					t.Fatalf("a call of %s succeeded", req.Model)
				}
			}
			for range 3 {
				if _, err := f.call(t.Context(), providerRequest()); err != nil {
					t.Fatal(err)
				}
			}
			want := defined{llm.ModelBucket(k.provider, canary, "test-model"), 420, 420}
			if got := lim.all(); len(got) != 1 || got[0] != want {
				t.Errorf("Defines = %+v, want only %+v: the served model's own bucket at 600 x 0.7", got, want)
			}
		})
	}
}

// TestProviderOtherModelsTakeTheSmallestStatedLimit: past the models a
// worker keeps limits for (all stating limits, all in use), a further
// model's calls share one bucket under the smallest limit stated for any
// of them: never unlimited.
func TestProviderOtherModelsTakeTheSmallestStatedLimit(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			lim := grantAll{&defineLog{MemoryLimiter: llm.NewMemoryLimiter()}}
			f := newFixture(t, k, func(r llmtest.Request) llmtest.Reply {
				if r.Model == "m-7" {
					return llmtest.Reply{Text: "ok", Header: statingRPM("600")}
				}
				return llmtest.Reply{Text: "ok", Header: statingRPM("6000")}
			}, func(pc *llm.ProviderConfig) { pc.Limiter = lim })
			for i := range llm.MaxModels + 1 {
				req := providerRequest()
				req.Model = fmt.Sprintf("m-%d", i)
				if _, err := f.call(t.Context(), req); err != nil {
					t.Fatal(err)
				}
			}
			last := providerRequest()
			last.Model = fmt.Sprintf("m-%d", llm.MaxModels)
			if _, err := f.call(t.Context(), last); err != nil {
				t.Fatal(err)
			}
			want := defined{llm.ModelBucket(k.provider, canary, "*"), 420, 420}
			got := lim.all()
			if len(got) == 0 || got[len(got)-1] != want {
				t.Errorf("Defines = %+v, want the last %+v: the smallest stated limit (600) x 0.7", got, want)
			}
		})
	}
}

// TestProviderIdleModelsGiveTheirPlace: a full model table of models
// that state limits but were not called for 10 minutes makes room for the
// next model called, which gets its own bucket under its own limit.
func TestProviderIdleModelsGiveTheirPlace(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			lim := grantAll{&defineLog{MemoryLimiter: llm.NewMemoryLimiter()}}
			f := newFixture(t, k, func(r llmtest.Request) llmtest.Reply {
				if r.Model == "late" {
					return llmtest.Reply{Text: "ok", Header: statingRPM("300")}
				}
				return llmtest.Reply{Text: "ok", Header: statingRPM("6000")}
			}, func(pc *llm.ProviderConfig) { pc.Limiter = lim })
			for i := range llm.MaxModels {
				req := providerRequest()
				req.Model = fmt.Sprintf("m-%d", i)
				if _, err := f.call(t.Context(), req); err != nil {
					t.Fatal(err)
				}
			}
			llm.IdleModels(f.model, 11*time.Minute)
			late := providerRequest()
			late.Model = "late"
			for range 2 {
				if _, err := f.call(t.Context(), late); err != nil {
					t.Fatal(err)
				}
			}
			want := defined{llm.ModelBucket(k.provider, canary, "late"), 210, 210}
			got := lim.all()
			if len(got) == 0 || got[len(got)-1] != want {
				t.Errorf("Defines = %+v, want the last %+v: its own bucket at 300 x 0.7", got, want)
			}
		})
	}
}
