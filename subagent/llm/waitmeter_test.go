package llm_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanout/fanout/subagent/llm"
	"github.com/fanout/fanout/subagent/llm/llmtest"
)

// TestWaitMeterCountsQueuedTime: the time a call waits in the fleet's rate
// limiter and in the backoff after a 429 is added to the WaitMeter its
// context carries, and a call served at once adds nothing: the orchestrator
// sizes concurrency from the time a call holds its task less this
// (docs/operations.md#concurrency-from-the-rate-limits).
func TestWaitMeterCountsQueuedTime(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			var n atomic.Int64
			f := newFixture(t, k, func(llmtest.Request) llmtest.Reply {
				if n.Add(1) == 2 {
					return llmtest.Reply{Status: http.StatusTooManyRequests, RetryAfter: "0.3"}
				}
				return llmtest.Reply{Text: "ok"}
			}, nil)
			served := measured(t, f)
			if served != 0 {
				t.Errorf("a call served at once waited %s; want 0", served)
			}
			if backoff := measured(t, f); backoff < 300*time.Millisecond {
				t.Errorf("a call refused 429 with retry-after 0.3s waited %s; want at least 300ms", backoff)
			}

			// A bucket of 120 a minute starts empty: the first call waits
			// half a second for it.
			g := newFixture(t, k, func(llmtest.Request) llmtest.Reply { return llmtest.Reply{Text: "ok"} },
				func(c *llm.ProviderConfig) {
					c.Limits = llm.RateLimit{RPM: 120, Headroom: 1}
					c.Limiter = llm.NewMemoryLimiter()
				})
			if limited := measured(t, g); limited < 400*time.Millisecond {
				t.Errorf("a call that waited for an empty bucket of 120 a minute waited %s; want about 500ms", limited)
			}
		})
	}
}

// measured makes one call on f and returns the time its meter counted.
func measured(t *testing.T, f *fixture) time.Duration {
	t.Helper()
	var m llm.WaitMeter
	ctx, cancel := context.WithTimeout(llm.WithWaitMeter(t.Context(), &m), 10*time.Second)
	defer cancel()
	if _, err := f.call(ctx, providerRequest()); err != nil {
		t.Fatal(err)
	}
	return m.Waited()
}
