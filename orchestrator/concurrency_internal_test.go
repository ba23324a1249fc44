package orchestrator

import (
	"strings"
	"testing"
	"time"
)

// TestConcurrencyArithmetic: the rules of docs/operations.md, "Concurrency
// from the rate limits", on figures the test controls.
func TestConcurrencyArithmetic(t *testing.T) {
	t.Parallel()
	base := concurrencyInputs{provider: "openai", model: "m", limit: RateLimit{RPM: 600}, headroom: 0.7,
		secondsPerCall: 2, tokensPerCall: 1000, observed: 10, sharing: 1, fallback: 16, most: 256, tasks: 50}
	for _, c := range []struct {
		name   string
		change func(*concurrencyInputs)
		want   int
		reason string
	}{
		// 600 RPM × 0.7 ÷ 60 = 7 calls/s; × 2 s per call = 14 in flight.
		{"requests", func(*concurrencyInputs) {}, 14, "14 = 600 RPM × 0.7 ÷ 60 s × 2.00 s per call, the run's share of the limit"},
		// The reason shows the run's share, not how many runs share it.
		{"two runs share it", func(in *concurrencyInputs) { in.sharing = 2 }, 7, "7 = 300 RPM × 0.7"},
		{"three runs, rounded down", func(in *concurrencyInputs) { in.sharing = 3 }, 4, "4 = 200 RPM × 0.7"},
		{"more runs than requests: a share of 1", func(in *concurrencyInputs) { in.limit.RPM, in.sharing = 5, 9 }, 1, "0 = 1 RPM"},
		{"slower calls, more in flight", func(in *concurrencyInputs) { in.secondsPerCall = 4 }, 28, "4.00 s per call"},
		{"the tenant's headroom", func(in *concurrencyInputs) { in.headroom = 0.5 }, 10, "× 0.5 ÷"},
		// 200,000 TPM × 0.7 ÷ 60 = 2,333 tokens/s; × 2 s ÷ 1,000 tokens = 4.67.
		{"tokens bind first", func(in *concurrencyInputs) { in.limit.TPM = 200_000 }, 4, "4 = 200000 TPM × 0.7 ÷ 60 s × 2.00 s per call ÷ 1000 tokens per call, the run's share"},
		{"tokens alone", func(in *concurrencyInputs) { in.limit = RateLimit{TPM: 600_000} }, 14, "TPM"},
		{"no limit known: the server's default", func(in *concurrencyInputs) { in.limit = RateLimit{} }, 16, "no rate limit is known"},
		{"never above the task count", func(in *concurrencyInputs) { in.tasks = 5 }, 5, "capped at the run's 5 tasks"},
		{"never above the server's cap", func(in *concurrencyInputs) { in.most = 8 }, 8, "capped at the server's max_concurrency 8"},
		{"never below 1", func(in *concurrencyInputs) { in.secondsPerCall = 0.05 }, 1, "raised to 1"},
		{"429s hold it", func(in *concurrencyInputs) { in.throttleCap = 3; in.limit.Throttled = 9 }, 3, "held to 3 after new 429s on the limit"},
		{"a cap that does not bind", func(in *concurrencyInputs) { in.throttleCap = 20 }, 14, "share of the limit"},
	} {
		in := base
		c.change(&in)
		got, why := in.choose()
		if got != c.want || !strings.Contains(why, c.reason) {
			t.Errorf("%s: chose %d (%q); want %d, the reason saying %q", c.name, got, why, c.want, c.reason)
		}
		// Never the fleet's figures: how many runs share the limit, and
		// the fleet's 429s, tell of other tenants' runs.
		if strings.Contains(why, "runs") || strings.Contains(why, "9 429s") {
			t.Errorf("%s: the reason %q tells of the fleet's runs or 429s", c.name, why)
		}
	}
}

// TestThrottleHalvesAndCreepsBack: 429s that grew between two reads halve
// the concurrency in effect, never below 1; each read without a new one
// adds 1 until the arithmetic binds again.
func TestThrottleHalvesAndCreepsBack(t *testing.T) {
	t.Parallel()
	var th throttle
	th.step(5, 12, 12) // the first read: a baseline, whatever it counts
	if th.cap != 0 {
		t.Fatalf("the first read set a cap of %d: want none (nothing grew)", th.cap)
	}
	th.step(8, 12, 12)
	if th.cap != 6 {
		t.Fatalf("429s grew 5 -> 8 at 12: cap %d, want 6", th.cap)
	}
	for want := 7; want < 12; want++ {
		th.step(8, th.cap, 12)
		if th.cap != want {
			t.Fatalf("a read without a new 429: cap %d, want %d", th.cap, want)
		}
	}
	th.step(8, th.cap, 12)
	if th.cap != 0 {
		t.Errorf("the cap reached the arithmetic's 12: cap %d, want none", th.cap)
	}
	for _, current := range []int{3, 1, 1} {
		th.step(th.last+1, current, 12)
		if want := max(1, current/2); th.cap != want {
			t.Errorf("429s grew at %d: cap %d, want %d (never below 1)", current, th.cap, want)
		}
	}
}

// TestCallTimeLessItsQueue: the seconds per call that size a run are the
// time a call held its task less the time it waited queued (the fleet's
// limiter, a slot, a 429's backoff: SubagentIteration.waited), so a full
// limiter does not make calls look slower and grow the concurrency to meet
// it (docs/operations.md#concurrency-from-the-rate-limits).
func TestCallTimeLessItsQueue(t *testing.T) {
	s := newCallStats()
	t0 := time.Unix(1000, 0)
	s.started(0, t0)
	s.iteration(0, t0.Add(10*time.Second), 500, 9500*time.Millisecond) // 9.5 s of it in the limiter
	s.iteration(0, t0.Add(10500*time.Millisecond), 1000, 0)
	secs, toks, _, observed := s.averages()
	if observed != 2 || secs < 0.499 || secs > 0.501 || toks != 500 {
		t.Errorf("averages %.3f s and %.0f tokens per call over %d calls; want 0.5 s (10 s less 9.5 s queued, then 0.5 s) and 500", secs, toks, observed)
	}
}
