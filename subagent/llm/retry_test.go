package llm_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanout/fanout/subagent/llm"
	"github.com/fanout/fanout/subagent/llm/llmtest"
)

func TestProvider429WithRetryAfterIsAFloor(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var arrivals []time.Time
			f := newFixture(t, k, func(r llmtest.Request) llmtest.Reply {
				mu.Lock()
				arrivals = append(arrivals, time.Now())
				mu.Unlock()
				if r.N == 1 {
					return llmtest.Reply{Status: http.StatusTooManyRequests, RetryAfter: "1"}
				}
				return llmtest.Reply{Text: "ok"}
			}, nil)
			if _, err := f.call(t.Context(), providerRequest()); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(arrivals) != 2 {
				t.Fatalf("%d requests, want 2", len(arrivals))
			}
			if gap := arrivals[1].Sub(arrivals[0]); gap < time.Second {
				t.Errorf("retried after %s, before the Retry-After of 1s", gap)
			}
		})
	}
}

func TestProvider429StormIsBounded(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, k, func(llmtest.Request) llmtest.Reply {
				return llmtest.Reply{Status: http.StatusTooManyRequests}
			}, func(c *llm.ProviderConfig) { c.Retry.MaxAttempts = 3 })
			_, err := f.call(t.Context(), providerRequest())
			var se *llm.StatusError
			if !errors.Is(err, llm.ErrRetriesExhausted) || !errors.As(err, &se) || se.StatusCode != 429 {
				t.Fatalf("err = %v, want retries exhausted on a 429", err)
			}
			if n := len(f.srv.Requests()); n != 3 {
				t.Errorf("%d attempts, want 3", n)
			}
			if !strings.Contains(err.Error(), k.provider) || !strings.Contains(err.Error(), "run-42") {
				t.Errorf("error %q does not name the provider and the run", err)
			}
		})
	}
}

func TestProviderRetryAfterPastDeadlineGivesUp(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, k, func(llmtest.Request) llmtest.Reply {
				return llmtest.Reply{Status: http.StatusServiceUnavailable, RetryAfter: "30"}
			}, nil)
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()
			start := time.Now()
			_, err := f.call(ctx, providerRequest())
			if !errors.Is(err, llm.ErrRetriesExhausted) || !strings.Contains(err.Error(), "deadline") {
				t.Fatalf("err = %v, want retries exhausted by the deadline", err)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("gave up after %s, want at once", d)
			}
			if n := len(f.srv.Requests()); n != 1 {
				t.Errorf("%d attempts, want 1: no retry before Retry-After", n)
			}
		})
	}
}

func TestProvider5xxThenSuccess(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, k, func(r llmtest.Request) llmtest.Reply {
				if r.N <= 2 {
					return llmtest.Reply{Status: 500 + r.N} // 501 is not retried by the SDK's rules, but is by ours: 5xx
				}
				return llmtest.Reply{Text: "ok", Usage: llm.Usage{InputTokens: 10, OutputTokens: 2}}
			}, nil)
			resp, err := f.call(t.Context(), providerRequest())
			if err != nil || resp.Usage.Total() != 12 || len(f.srv.Requests()) != 3 {
				t.Fatalf("resp %+v err %v after %d requests, want success on the third", resp, err, len(f.srv.Requests()))
			}
		})
	}
}

// gatewayPage is what nginx answers when the upstream is gone.
const gatewayPage = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n" +
	"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"

// TestProviderForeign5xxMayBeBilled answers a 5xx whose body is not in the
// provider's error shape (a gateway's page, a non-standard JSON error). It
// may come after the provider ran and billed the call, so Call returns it
// at once, unretried, as a *StatusError that is ErrMaybeBilled, with the
// status, the body (redacted, at most 512 bytes) and Retry-After; it is
// not a malformed reply.
func TestProviderForeign5xxMayBeBilled(t *testing.T) {
	t.Parallel()
	long := `{"error":"upstream failed for key ` + canary + `: ` + strings.Repeat("x", 2000) + `"}`
	cases := []struct {
		name, body, contentType, retryAfter, want string
		status                                    int
		wantRetryAfter                            time.Duration
	}{
		{"json error string", `{"error":"TypeError","message":"Cannot read properties of undefined (reading 'choices')"}`,
			"", "", "TypeError", 500, 0},
		{"html gateway page", gatewayPage, "text/html", "", "502 Bad Gateway", 502, 0},
		{"long body echoing the key", long, "", "7", "upstream failed for key [REDACTED]", 503, 7 * time.Second},
	}
	for _, k := range kinds {
		for _, c := range cases {
			t.Run(k.name+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				f := newFixture(t, k, func(llmtest.Request) llmtest.Reply {
					return llmtest.Reply{Status: c.status, Raw: c.body, ContentType: c.contentType, RetryAfter: c.retryAfter}
				}, nil)
				_, err := f.call(t.Context(), providerRequest())
				var se *llm.StatusError
				if !errors.Is(err, llm.ErrMaybeBilled) || !errors.As(err, &se) || !se.MaybeBilled() || se.Retryable() {
					t.Fatalf("err = %v, want a *StatusError that may have been billed and is not retried", err)
				}
				if errors.Is(err, llm.ErrMalformedReply) || errors.Is(err, llm.ErrRetriesExhausted) {
					t.Errorf("err = %v: not a malformed reply, and never retried inside the call", err)
				}
				if se.StatusCode != c.status || se.RetryAfter != c.wantRetryAfter {
					t.Errorf("status %d, Retry-After %s; want %d, %s", se.StatusCode, se.RetryAfter, c.status, c.wantRetryAfter)
				}
				if !strings.Contains(se.Message, c.want) || len(se.Message) > 512 {
					t.Errorf("message %q (%d bytes), want the body with %q, at most 512 bytes", se.Message, len(se.Message), c.want)
				}
				text := err.Error()
				for _, part := range []string{k.provider, "run-42", fmt.Sprint(c.status), c.want} {
					if !strings.Contains(text, part) {
						t.Errorf("error %q does not say %q", text, part)
					}
				}
				if c.wantRetryAfter > 0 && !strings.Contains(text, "retry after 7s") {
					t.Errorf("error %q does not say when to retry", text)
				}
				if n := len(f.srv.Requests()); n != 1 {
					t.Errorf("%d attempts, want 1: a reply that may have been billed is never retried inside the call", n)
				}
				// f's cleanup greps the errors and the logs for the key.
			})
		}
	}
}

// TestProviderForeign4xx answers error statuses below 500 with bodies not
// in the provider's shape: the request was refused, so nothing was billed.
// A 429 is retried inside the call like the provider's own; a 404 fails at
// once. Neither is a malformed reply.
func TestProviderForeign4xx(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, k, func(r llmtest.Request) llmtest.Reply {
				switch r.N {
				case 1:
					return llmtest.Reply{Status: 429, Raw: "<html><body>Too Many Requests</body></html>", ContentType: "text/html"}
				case 2:
					return llmtest.Reply{Text: "ok", Usage: llm.Usage{InputTokens: 10, OutputTokens: 2}}
				}
				return llmtest.Reply{Status: 404, Raw: "404 page not found", ContentType: "text/plain"}
			}, nil)
			resp, err := f.call(t.Context(), providerRequest())
			if err != nil || resp.Usage.Total() != 12 || len(f.srv.Requests()) != 2 {
				t.Fatalf("resp %+v, err %v after %d requests; want the 429 retried, then success", resp, err, len(f.srv.Requests()))
			}
			_, err = f.call(t.Context(), providerRequest())
			var se *llm.StatusError
			if !errors.As(err, &se) || se.StatusCode != 404 || se.MaybeBilled() || se.Retryable() ||
				errors.Is(err, llm.ErrMaybeBilled) || errors.Is(err, llm.ErrMalformedReply) || !strings.Contains(se.Message, "404 page not found") {
				t.Fatalf("err = %v, want a 404 StatusError with its body, not billed, not malformed", err)
			}
			if n := len(f.srv.Requests()); n != 3 {
				t.Errorf("%d requests, want 3: a 404 is not retried", n)
			}
		})
	}
}

func TestProvider401NotRetried(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			srv := llmtest.New(llmtest.Config{Provider: k.provider, Key: "the-right-key"})
			defer srv.Close()
			f := newFixture(t, k, nil, func(c *llm.ProviderConfig) { c.BaseURL = srv.BaseURL() })
			_, err := f.call(t.Context(), providerRequest())
			var se *llm.StatusError
			if !errors.As(err, &se) || se.StatusCode != 401 || errors.Is(err, llm.ErrRetriesExhausted) {
				t.Fatalf("err = %v, want a 401 StatusError", err)
			}
			if n := len(srv.Requests()); n != 1 {
				t.Errorf("%d attempts, want 1", n)
			}
			if !strings.Contains(err.Error(), k.provider) || !strings.Contains(err.Error(), "401") {
				t.Errorf("error %q is not clear", err)
			}
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		h    http.Header
		want time.Duration
	}{
		{http.Header{"Retry-After": {"7"}}, 7 * time.Second},
		{http.Header{"Retry-After": {now.Add(90 * time.Second).Format(http.TimeFormat)}}, 90 * time.Second},
		{http.Header{"Retry-After": {now.Add(-time.Hour).Format(http.TimeFormat)}}, 0},
		{http.Header{"Retry-After-Ms": {"250"}, "Retry-After": {"9"}}, 250 * time.Millisecond},
		{http.Header{"Retry-After": {"soon"}}, 0},
		{http.Header{}, 0},
	} {
		if got := llm.ParseRetryAfter(tc.h, now); got != tc.want {
			t.Errorf("ParseRetryAfter(%v) = %s, want %s", tc.h, got, tc.want)
		}
	}
}

func TestBackoffFullJitterCappedWithFloor(t *testing.T) {
	t.Parallel()
	p := llm.RetryPolicy{BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second,
		JitterFunc: func(d time.Duration) time.Duration { return d }} // the ceiling
	for n, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 60: time.Second} {
		if got := p.Backoff(n, 0); got != want {
			t.Errorf("Backoff(%d) = %s, want %s", n, got, want)
		}
	}
	// Above a Retry-After the jitter spans max(RA/2, the backoff ceiling),
	// at most MaxDelay.
	for _, tc := range []struct {
		n      int
		ra     time.Duration
		spread time.Duration
	}{{1, 5 * time.Second, time.Second}, {1, time.Second, 500 * time.Millisecond}, {4, time.Second, 800 * time.Millisecond}, {1, 100 * time.Millisecond, 100 * time.Millisecond}} {
		if got := p.Backoff(tc.n, tc.ra); got != tc.ra+tc.spread {
			t.Errorf("Backoff(%d) with Retry-After %s at the jitter's top = %s, want %s", tc.n, tc.ra, got, tc.ra+tc.spread)
		}
	}
	p.JitterFunc = func(time.Duration) time.Duration { return 0 }
	if got := p.Backoff(3, 0); got != 0 {
		t.Errorf("full jitter may sleep 0, got %s", got)
	}
	if got := p.Backoff(1, 5*time.Second); got != 5*time.Second {
		t.Errorf("Backoff with Retry-After 5s at the jitter's bottom = %s: want the floor, 5s", got)
	}
	p.JitterFunc = func(d time.Duration) time.Duration { return -d } // a bad source cannot undercut the floor
	if got := p.Backoff(1, 5*time.Second); got != 5*time.Second {
		t.Errorf("Backoff with Retry-After 5s = %s: the floor was undercut", got)
	}
}
