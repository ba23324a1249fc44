package llm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanout/fanout/subagent/llm"
	"github.com/fanout/fanout/subagent/llm/llmtest"
)

var callerTag = regexp.MustCompile(`caller-\d+`)

// TestProvider429StormWakesSpreadAboveRetryAfter: many callers refused
// together with the same Retry-After never retry before it, and come back
// spread over the window above it instead of in the same millisecond. The
// jitter source is seeded, so the sleeps (read from the retry log lines)
// are the same on every run.
func TestProvider429StormWakesSpreadAboveRetryAfter(t *testing.T) {
	t.Parallel()
	const callers = 16
	const retryAfter = 400 * time.Millisecond
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			refused, retried := map[string]time.Time{}, map[string]time.Time{}
			f := newFixture(t, k, func(r llmtest.Request) llmtest.Reply {
				who := callerTag.FindString(fmt.Sprint(r.Messages))
				mu.Lock()
				defer mu.Unlock()
				if _, ok := refused[who]; !ok {
					refused[who] = time.Now()
					return llmtest.Reply{Status: http.StatusTooManyRequests, RetryAfter: "0.4"}
				}
				retried[who] = time.Now()
				return llmtest.Reply{Text: "ok"}
			}, func(c *llm.ProviderConfig) {
				var rmu sync.Mutex
				rng := rand.New(rand.NewPCG(12, 34))
				c.Retry = llm.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Second,
					JitterFunc: func(d time.Duration) time.Duration {
						rmu.Lock()
						defer rmu.Unlock()
						return time.Duration(rng.Int64N(int64(d) + 1))
					}}
			})
			var wg sync.WaitGroup
			for i := range callers {
				wg.Go(func() {
					req := providerRequest()
					req.Messages = append(req.Messages, llm.Message{Role: llm.RoleUser, Content: fmt.Sprintf("caller-%02d", i)})
					if _, err := f.call(t.Context(), req); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()

			mu.Lock()
			defer mu.Unlock()
			if len(refused) != callers || len(retried) != callers {
				t.Fatalf("%d callers refused, %d retried; want %d each", len(refused), len(retried), callers)
			}
			var wakes []time.Time
			for who, at := range retried {
				if gap := at.Sub(refused[who]); gap < retryAfter {
					t.Errorf("%s retried %s after its 429, before the Retry-After of %s", who, gap, retryAfter)
				}
				wakes = append(wakes, at)
			}
			sleeps := retrySleeps(t, f.w.String())
			if len(sleeps) != callers {
				t.Fatalf("%d retry log lines, want %d", len(sleeps), callers)
			}
			slices.Sort(sleeps)
			if sleeps[0] < retryAfter || sleeps[len(sleeps)-1] > retryAfter*3/2 {
				t.Errorf("sleeps %v: want each in [Retry-After, 1.5 x Retry-After] = [%s, %s]", sleeps, retryAfter, retryAfter*3/2)
			}
			if spread := sleeps[len(sleeps)-1] - sleeps[0]; spread < retryAfter/4 {
				t.Errorf("sleeps %v span %s: callers told the same Retry-After wake together", sleeps, spread)
			}
			// No 5ms window holds more than a quarter of the callers.
			for i := range sleeps {
				j := i
				for j < len(sleeps) && sleeps[j]-sleeps[i] < 5*time.Millisecond {
					j++
				}
				if j-i > callers/4 {
					t.Errorf("%d of %d sleeps within 5ms of %s: %v", j-i, callers, sleeps[i], sleeps)
					break
				}
			}
			// What the server saw: the retries arrived spread out too.
			slices.SortFunc(wakes, func(a, b time.Time) int { return a.Compare(b) })
			if spread := wakes[len(wakes)-1].Sub(wakes[0]); spread < retryAfter/8 {
				t.Errorf("the %d retries reached the server within %s of each other", callers, spread)
			}
		})
	}
}

// retrySleeps reads the sleep of every "model call retried" line of a
// provider's JSON log.
func retrySleeps(t *testing.T, log string) []time.Duration {
	t.Helper()
	var out []time.Duration
	for line := range strings.SplitSeq(log, "\n") {
		var rec struct {
			Msg   string `json:"msg"`
			Sleep int64  `json:"sleep"`
		}
		if line == "" || json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != "model call retried" {
			continue
		}
		out = append(out, time.Duration(rec.Sleep))
	}
	return out
}

// steppingLimiter is a MemoryLimiter on a clock of its own that, instead of
// returning a wait, moves its clock on by the wait and takes again: a caller
// never sleeps, and each grant happens at the clock's time.
type steppingLimiter struct {
	*llm.MemoryLimiter

	mu     sync.Mutex
	now    time.Time
	start  time.Time
	grants []time.Duration // since start
	rpm    []int64         // what Define was given
}

func newSteppingLimiter() *steppingLimiter {
	s := &steppingLimiter{start: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	s.now = s.start
	s.MemoryLimiter = llm.NewMemoryLimiterAt(func() time.Time { return s.now }) // read under mu
	return s
}

func (s *steppingLimiter) Define(ctx context.Context, bucket string, rpm, tpm int64, burst time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rpm = append(s.rpm, rpm)
	return s.MemoryLimiter.Define(ctx, bucket, rpm, tpm, burst)
}

func (s *steppingLimiter) Take(ctx context.Context, bucket string, requests, tokens int64) (time.Duration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		wait, err := s.MemoryLimiter.Take(ctx, bucket, requests, tokens)
		if err != nil {
			return 0, err
		}
		if wait <= 0 {
			s.grants = append(s.grants, s.now.Sub(s.start))
			return 0, nil
		}
		s.now = s.now.Add(wait)
	}
}

func (s *steppingLimiter) Refund(ctx context.Context, bucket string, tokens int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.MemoryLimiter.Refund(ctx, bucket, tokens)
}

// TestProviderHeadroomCapsAMinute: a key stated at 100 RPM starts at most
// 70 calls in a minute with the default headroom (and 50 with 0.5), and
// the headroom is applied once: the limiter is given 70, not 49.
func TestProviderHeadroomCapsAMinute(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		headroom float64
		want     int
	}{{0, 70}, {0.7, 70}, {0.5, 50}, {1, 100}} {
		t.Run(fmt.Sprint(tc.headroom), func(t *testing.T) {
			t.Parallel()
			lim := newSteppingLimiter()
			f := newFixture(t, kinds[0], nil, func(c *llm.ProviderConfig) {
				c.Limiter = lim
				c.Limits = llm.RateLimit{RPM: 100, Headroom: tc.headroom}
			})
			for range 120 {
				if _, err := f.call(t.Context(), providerRequest()); err != nil {
					t.Fatal(err)
				}
			}
			lim.mu.Lock()
			defer lim.mu.Unlock()
			var inMinute, nearMinute int
			for _, g := range lim.grants {
				if g <= time.Minute {
					inMinute++
				}
				if g <= time.Minute+time.Second {
					nearMinute++
				}
			}
			// From an empty bucket the want-th call starts at about 60s: it
			// may fall either side of the minute by a rounding error.
			if inMinute > tc.want || nearMinute < tc.want {
				t.Errorf("%d calls started in the first minute (%d by 61s), want at most %d and %d by 61s", inMinute, nearMinute, tc.want, tc.want)
			}
			if !slices.Equal(lim.rpm, []int64{int64(tc.want)}) {
				t.Errorf("the limiter was given rpm %v, want [%d]: the headroom applied once", lim.rpm, tc.want)
			}
			if n := len(f.srv.Requests()); n != 120 {
				t.Errorf("server saw %d requests, want 120", n)
			}
		})
	}
}

// TestProviderLimitsArePerProvider: one limiter shared by both providers
// of a worker keeps a bucket per provider key, so openai's RPM does not
// throttle anthropic, nor the other way round.
func TestProviderLimitsArePerProvider(t *testing.T) {
	t.Parallel()
	for _, slow := range []kind{kinds[0], kinds[2]} {
		t.Run("slow-"+slow.name, func(t *testing.T) {
			t.Parallel()
			lim := llm.NewMemoryLimiter()
			models := map[string]*fixture{}
			for _, k := range []kind{kinds[0], kinds[2]} {
				rpm := int64(60_000) // 700/s with the headroom
				if k == slow {
					rpm = 10 // 7/min: the first call waits 8.6s
				}
				models[k.provider] = newFixture(t, k, nil, func(c *llm.ProviderConfig) {
					c.Limiter = lim
					c.Limits = llm.RateLimit{RPM: rpm}
				})
			}
			fast := llmtest.Anthropic
			if slow.provider == llmtest.Anthropic {
				fast = llmtest.OpenAI
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			for range 5 {
				if _, err := models[fast].call(ctx, providerRequest()); err != nil {
					t.Fatalf("%s, limited at 60000 RPM, while %s is at 10: %v", fast, slow.provider, err)
				}
			}
			sctx, scancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			defer scancel()
			if _, err := models[slow.provider].call(sctx, providerRequest()); err == nil {
				t.Errorf("%s at 10 RPM started a call at once from an empty bucket", slow.provider)
			}
			if n := len(models[slow.provider].srv.Requests()); n != 0 {
				t.Errorf("%s server saw %d requests, want 0", slow.provider, n)
			}
		})
	}
}

func TestRateLimitEffective(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in      llm.RateLimit
		rpm     int64
		tpm     int64
		wantErr string
	}{
		{in: llm.RateLimit{RPM: 100, TPM: 200_000}, rpm: 70, tpm: 140_000},
		{in: llm.RateLimit{RPM: 100, TPM: 0, Headroom: 0.29}, rpm: 29},
		{in: llm.RateLimit{RPM: 3, Headroom: 0.7}, rpm: 2},
		{in: llm.RateLimit{RPM: 500, Headroom: 1}, rpm: 500},
		{in: llm.RateLimit{}, rpm: 0, tpm: 0},
		{in: llm.RateLimit{RPM: 1}, wantErr: "rpm 1 with headroom 0.7 allows 0 per minute"},
		{in: llm.RateLimit{RPM: 10, Headroom: 1.5}, wantErr: "headroom 1.5: must be in (0, 1]"},
		{in: llm.RateLimit{RPM: 10, Headroom: -0.1}, wantErr: "headroom -0.1: must be in (0, 1]"},
		{in: llm.RateLimit{RPM: -1}, wantErr: "must be >= 0"},
	} {
		got, err := tc.in.Effective()
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%+v.Effective() err = %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got.RPM != tc.rpm || got.TPM != tc.tpm {
			t.Errorf("%+v.Effective() = %+v, %v; want rpm %d tpm %d", tc.in, got, err, tc.rpm, tc.tpm)
			continue
		}
		if again, _ := got.Effective(); again != got {
			t.Errorf("Effective applied twice: %+v then %+v", got, again)
		}
	}
	_, err := llm.NewOpenAI(llm.OpenAIConfig{ProviderConfig: llm.ProviderConfig{APIKey: "k", Model: "m",
		Limits: llm.RateLimit{RPM: 10, Headroom: 2}}})
	if err == nil || !strings.Contains(err.Error(), "headroom 2") {
		t.Errorf("NewOpenAI with headroom 2: err = %v, want it refused", err)
	}
}
