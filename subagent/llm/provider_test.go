package llm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/fanout/fanout/subagent/llm"
	"github.com/fanout/fanout/subagent/llm/llmtest"
)

// witness collects everything a test writes that could leak the key
// (canary): the provider's log output and error texts. Each test greps its
// own witness, and slog.Default()'s (see TestMain), for any piece of it.
type witness struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *witness) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *witness) err(err error) {
	if err != nil {
		fmt.Fprintf(w, "error: %v | %+v | %#v\n", err, err, err)
	}
}

func (w *witness) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func (w *witness) check(t *testing.T) {
	t.Helper()
	if p, ok := llmtest.LeakedPiece(w.String(), canary); ok {
		t.Errorf("the API key (%q) leaked into the provider's logs or errors:\n%s", p, llmtest.LinesHolding(w.String(), p))
	}
	if p, ok := llmtest.LeakedPiece(defaultLog.String(), canary); ok {
		t.Errorf("the API key (%q) leaked into slog.Default(), which every test of the package shares:\n%s",
			p, llmtest.LinesHolding(defaultLog.String(), p))
	}
}

type kind struct {
	name     string
	provider string
	stream   bool
}

var kinds = []kind{{"openai", llmtest.OpenAI, false}, {"openai-stream", llmtest.OpenAI, true}, {"anthropic", llmtest.Anthropic, false}}

type fixture struct {
	srv   *llmtest.Server
	model llm.Model
	w     *witness
}

func newFixture(t *testing.T, k kind, script func(llmtest.Request) llmtest.Reply, tune func(*llm.ProviderConfig)) *fixture {
	t.Helper()
	srv := llmtest.New(llmtest.Config{Provider: k.provider, Key: canary, Script: script})
	t.Cleanup(srv.Close)
	w := &witness{}
	cfg := llm.ProviderConfig{
		APIKey: canary, BaseURL: srv.BaseURL(), Model: "test-model",
		CallTimeout: 5 * time.Second,
		Retry:       llm.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond},
		Logger:      slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if tune != nil {
		tune(&cfg)
	}
	var m llm.Model
	var err error
	switch k.provider {
	case llmtest.OpenAI:
		var o *llm.OpenAI
		o, err = llm.NewOpenAI(llm.OpenAIConfig{ProviderConfig: cfg, Stream: k.stream})
		if o != nil {
			t.Cleanup(o.Close)
		}
		m = o
	default:
		var a *llm.Anthropic
		a, err = llm.NewAnthropic(llm.AnthropicConfig{ProviderConfig: cfg})
		if a != nil {
			t.Cleanup(a.Close)
		}
		m = a
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.check(t) })
	return &fixture{srv: srv, model: m, w: w}
}

func (f *fixture) call(ctx context.Context, req llm.Request) (llm.Response, error) {
	resp, err := f.model.Call(ctx, req)
	f.w.err(err)
	return resp, err
}

func providerRequest() llm.Request {
	return llm.Request{
		Messages: []llm.Message{
			{Role: llm.RoleSystem, Content: "You are a research subagent."},
			{Role: llm.RoleUser, Content: "find things about go"},
		},
		Tools:     tools,
		MaxTokens: 500,
		Meta:      llm.Meta{RunID: "run-42", TaskID: "t1", Iteration: 1, ReservationID: 7},
	}
}

func TestProviderToolCallRoundTrip(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, k, func(r llmtest.Request) llmtest.Reply {
				if r.N == 1 {
					return llmtest.Reply{
						ToolCalls: []llm.ToolCall{{ID: "call_a", Name: "search", Args: json.RawMessage(`{"query":"go generics"}`)}},
						Usage:     llm.Usage{InputTokens: 120, OutputTokens: 30},
					}
				}
				return llmtest.Reply{Text: `{"facts":[{"text":"go has generics","sources":["https://go.dev"]}]}`,
					Usage: llm.Usage{InputTokens: 200, OutputTokens: 40}}
			}, nil)
			req := providerRequest()
			resp, err := f.call(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			want := llm.ToolCall{ID: "call_a", Name: "search", Args: json.RawMessage(`{"query":"go generics"}`)}
			if len(resp.ToolCalls) != 1 || fmt.Sprint(resp.ToolCalls[0]) != fmt.Sprint(want) || resp.FinishReason != llm.FinishToolCalls {
				t.Fatalf("first reply = %+v, want tool call %+v", resp, want)
			}
			if resp.Usage != (llm.Usage{InputTokens: 120, OutputTokens: 30}) {
				t.Errorf("usage = %+v, want the provider's 120+30", resp.Usage)
			}
			req.Messages = append(req.Messages,
				llm.Message{Role: llm.RoleAssistant, ToolCalls: resp.ToolCalls},
				llm.Message{Role: llm.RoleTool, ToolCallID: "call_a", Content: "https://go.dev says generics exist"})
			req.Meta.Iteration = 2
			resp, err = f.call(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(resp.Content, "go has generics") || resp.FinishReason != llm.FinishStop ||
				resp.Usage != (llm.Usage{InputTokens: 200, OutputTokens: 40}) {
				t.Errorf("second reply = %+v", resp)
			}
			reqs := f.srv.Requests()
			if len(reqs) != 2 || !reqs[1].AuthOK || reqs[1].Stream != k.stream || reqs[1].MaxTokens != 500 ||
				reqs[1].Model != "test-model" || len(reqs[1].Tools) != 2 {
				t.Fatalf("server saw %+v", reqs)
			}
			// The tool result went back in the provider's format.
			last := reqs[1].Messages[len(reqs[1].Messages)-1]
			switch k.provider {
			case llmtest.OpenAI:
				if last["role"] != "tool" || last["tool_call_id"] != "call_a" {
					t.Errorf("last message = %v, want a tool message for call_a", last)
				}
				asst := reqs[1].Messages[len(reqs[1].Messages)-2]
				if !strings.Contains(fmt.Sprint(asst["tool_calls"]), `{"query":"go generics"}`) {
					t.Errorf("assistant message = %v, want the tool call's JSON arguments", asst)
				}
			case llmtest.Anthropic:
				blocks, _ := last["content"].([]any)
				b, _ := blocks[0].(map[string]any)
				if last["role"] != "user" || b["type"] != "tool_result" || b["tool_use_id"] != "call_a" {
					t.Errorf("last message = %v, want a user message with a tool_result for call_a", last)
				}
				if _, ok := reqs[1].Body["system"]; !ok {
					t.Error("the system message was not sent as system")
				}
			}
		})
	}
}

func TestProviderComputedUsageFitsInputBound(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, k, nil, nil)
			req := providerRequest()
			resp, err := f.call(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Usage.InputTokens <= 0 || resp.Usage.OutputTokens <= 0 || resp.Content != "fake answer" {
				t.Fatalf("reply = %+v", resp)
			}
			if bound := llm.InputBound(req.Messages, req.Tools...); resp.Usage.InputTokens > bound {
				t.Errorf("input usage %d over the bound %d", resp.Usage.InputTokens, bound)
			}
		})
	}
}

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

func TestProviderEchoedKeyIsRedacted(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, k, func(llmtest.Request) llmtest.Reply {
				return llmtest.Reply{Status: 403, Message: "key " + canary + " is not allowed here"}
			}, nil)
			_, err := f.call(t.Context(), providerRequest())
			if err == nil || !strings.Contains(err.Error(), "[REDACTED]") {
				t.Fatalf("err = %v, want the echoed key redacted", err)
			}
			// f's cleanup greps err and the logs for the canary.
		})
	}
}

func TestProviderMalformedJSON(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		if k.stream {
			continue
		}
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, k, func(llmtest.Request) llmtest.Reply {
				return llmtest.Reply{Raw: `{"id": "x", "choices": [ {"index": 0, "mess`}
			}, nil)
			_, err := f.call(t.Context(), providerRequest())
			if !errors.Is(err, llm.ErrMalformedReply) {
				t.Fatalf("err = %v, want ErrMalformedReply", err)
			}
			if !strings.HasPrefix(err.Error(), k.provider+": run run-42:") {
				t.Errorf("error %q does not start with the provider and the run", err)
			}
			if n := len(f.srv.Requests()); n != 1 {
				t.Errorf("%d attempts, want 1: usage unknown, never retried", n)
			}
		})
	}
}

func TestProviderMidStreamDisconnect(t *testing.T) {
	t.Parallel()
	f := newFixture(t, kinds[1], func(llmtest.Request) llmtest.Reply {
		return llmtest.Reply{Text: "a long answer that will be cut off", CutAfter: 3}
	}, nil)
	_, err := f.call(t.Context(), providerRequest())
	if !errors.Is(err, llm.ErrMalformedReply) || !strings.Contains(err.Error(), "openai: run run-42") {
		t.Fatalf("err = %v, want a cut-off reply error naming provider and run", err)
	}
	if n := len(f.srv.Requests()); n != 1 {
		t.Errorf("%d attempts, want 1: a cut stream may be billed, never retried", n)
	}
}

func TestProviderHungServerTimesOut(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, k, func(llmtest.Request) llmtest.Reply { return llmtest.Reply{Hang: true} },
				func(c *llm.ProviderConfig) { c.CallTimeout = 300 * time.Millisecond })
			start := time.Now()
			_, err := f.call(t.Context(), providerRequest())
			if !errors.Is(err, llm.ErrCallTimeout) {
				t.Fatalf("err = %v, want ErrCallTimeout", err)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("timed out after %s", d)
			}
			select {
			case <-f.srv.Cancelled():
			case <-time.After(5 * time.Second):
				t.Fatal("the server never saw the request go away")
			}
			if n := len(f.srv.Requests()); n != 1 {
				t.Errorf("%d attempts, want 1", n)
			}
		})
	}
}

func TestProviderCancelClosesRequest(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, k, func(llmtest.Request) llmtest.Reply { return llmtest.Reply{Hang: true} }, nil)
			cause := errors.New("run budget exhausted")
			ctx, cancel := context.WithCancelCause(t.Context())
			errc := make(chan error, 1)
			go func() {
				_, err := f.call(ctx, providerRequest())
				errc <- err
			}()
			for len(f.srv.Requests()) == 0 {
				time.Sleep(time.Millisecond) // wait for the request to arrive
			}
			cancel(cause)
			select {
			case err := <-errc:
				if !errors.Is(err, cause) {
					t.Errorf("err = %v, want the cancel cause", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("cancelled call did not return")
			}
			select {
			case <-f.srv.Cancelled():
			case <-time.After(5 * time.Second):
				t.Fatal("the server never saw the connection go away")
			}
		})
	}
}

func TestProviderSlotsCapConcurrency(t *testing.T) {
	t.Parallel()
	var inFlight, peak atomic.Int64
	release := make(chan struct{})
	f := newFixture(t, kinds[0], func(llmtest.Request) llmtest.Reply {
		n := inFlight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-release
		inFlight.Add(-1)
		return llmtest.Reply{Text: "ok"}
	}, func(c *llm.ProviderConfig) { c.Slots = semaphore.NewWeighted(2) })
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = f.call(t.Context(), providerRequest())
		}()
	}
	for len(f.srv.Requests()) < 2 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // give a third call the chance to slip through
	close(release)
	wg.Wait()
	if p := peak.Load(); p != 2 {
		t.Errorf("peak concurrency %d, want 2", p)
	}
}

func TestProviderRateLimiterDebitsAndRefunds(t *testing.T) {
	t.Parallel()
	lim := llm.NewMemoryLimiter()
	f := newFixture(t, kinds[0], func(llmtest.Request) llmtest.Reply {
		return llmtest.Reply{Text: "ok", Usage: llm.Usage{InputTokens: 10, OutputTokens: 5}}
	}, func(c *llm.ProviderConfig) {
		c.Limiter = lim
		c.Limits = llm.RateLimit{RPM: 6000, TPM: 600_000, Burst: time.Second} // 100 req/s, 10k tok/s
	})
	start := time.Now()
	for range 20 {
		if _, err := f.call(t.Context(), providerRequest()); err != nil {
			t.Fatal(err)
		}
	}
	// 20 requests at 100/s from an empty bucket take about 0.2s; each
	// debits ~600 tokens and refunds all but 15, so TPM does not bind.
	if d := time.Since(start); d < 150*time.Millisecond || d > 2*time.Second {
		t.Errorf("20 calls took %s, want about 200ms", d)
	}
	bucket := llm.BucketName("openai", canary)
	if p, ok := llmtest.LeakedPiece(bucket, canary); ok {
		t.Fatalf("bucket name %q holds a piece of the key (%q)", bucket, p)
	}
	if id := llm.KeyID(canary); id == "" {
		t.Error("KeyID is empty")
	} else if p, ok := llmtest.LeakedPiece(id, canary); ok {
		t.Errorf("KeyID = %q holds a piece of the key (%q)", id, p)
	}
}

func TestMemoryLimiterBurstCannotShareABalance(t *testing.T) {
	t.Parallel()
	lim := llm.NewMemoryLimiter()
	if err := lim.Define(t.Context(), "b", 600, 0, time.Second); err != nil { // 10/s, capacity 10
		t.Fatal(err)
	}
	time.Sleep(time.Second) // fill up
	var granted atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if w, err := lim.Take(t.Context(), "b", 1, 0); err == nil && w == 0 {
				granted.Add(1)
			}
		}()
	}
	wg.Wait()
	max := 10 + int64(time.Since(start).Seconds()*10) + 1
	if g := granted.Load(); g < 10 || g > max {
		t.Errorf("%d of 100 concurrent takes passed on a balance of 10, want 10..%d", g, max)
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

func TestCompressStructured(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, k, func(r llmtest.Request) llmtest.Reply {
				if r.N == 2 {
					return llmtest.Reply{Text: "I could not format this, but go has generics."}
				}
				if r.Schema != "fact_summary" && r.ForcedTool != "fact_summary" {
					return llmtest.Reply{Text: "no schema was asked for"}
				}
				return llmtest.Reply{Text: `{"facts":[{"text":"go has generics","sources":["https://go.dev"]}]}`}
			}, nil)
			req := providerRequest()
			out, err := llm.Compress(t.Context(), f.model, req)
			if err != nil {
				t.Fatal(err)
			}
			if out.Degraded || len(out.Facts) != 1 || out.Facts[0].Text != "go has generics" || out.Facts[0].Sources[0] != "https://go.dev" {
				t.Fatalf("compressed = %+v", out)
			}
			if out.Response.Usage.Total() <= 0 {
				t.Error("no usage to settle")
			}
			if r := f.srv.Requests()[0]; len(r.Tools) > 1 || (k.provider == llmtest.OpenAI && len(r.Tools) != 0) {
				t.Errorf("compression offered tools %v", r.Tools)
			}
			out, err = llm.Compress(t.Context(), f.model, req)
			if err != nil {
				t.Fatal(err)
			}
			if !out.Degraded || len(out.Facts) != 1 || !strings.Contains(out.Facts[0].Text, "go has generics") {
				t.Errorf("unparsable reply compressed to %+v, want one flagged fact holding the text", out)
			}
		})
	}
}

func TestCompressSimFallsBackToInstruction(t *testing.T) {
	t.Parallel()
	sim, _ := llm.NewSim(llm.SimConfig{FinishAfter: 1, Facts: 2})
	out, err := llm.Compress(t.Context(), sim, request("t1", 1))
	if err != nil || out.Degraded || len(out.Facts) != 2 {
		t.Fatalf("Compress(sim) = %+v, %v", out, err)
	}
	if llm.CompressTokens() <= 0 {
		t.Error("CompressTokens must count the instruction and schema")
	}
}

// TestProviderToolsCarryJSON sends a tool whose schema has every JSON type,
// a call whose arguments hold a number, an array, a nested object and an
// absent optional field, and a failed call's result: the schema and the
// arguments reach the provider unchanged, the reply's arguments come back
// as written, and Anthropic's tool_result says is_error.
func TestProviderToolsCarryJSON(t *testing.T) {
	t.Parallel()
	schema := `{"type":"object","properties":{"n":{"type":"integer"},"ratio":{"type":"number"},` +
		`"tags":{"type":"array","items":{"type":"string"}},"flag":{"type":"boolean"},` +
		`"where":{"type":"object","properties":{"city":{"type":"string","enum":["Oslo","Lima"]}}},` +
		`"note":{"type":"string"}},"required":["n","tags"],"additionalProperties":false}`
	sent := `{"n":3,"ratio":0.5,"tags":["a","b"],"flag":false,"where":{"city":"Oslo"}}`
	reply := `{"n":-7,"tags":[],"where":{"city":"Lima","extra":[1,{"deep":null}]}}`
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, k, func(r llmtest.Request) llmtest.Reply {
				return llmtest.Reply{ToolCalls: []llm.ToolCall{{ID: "call_b", Name: "typed", Args: json.RawMessage(reply)}},
					Usage: llm.Usage{InputTokens: 10, OutputTokens: 5}}
			}, nil)
			req := providerRequest()
			req.Tools = []llm.ToolDef{{Name: "typed", Description: "every type", Schema: json.RawMessage(schema)}}
			req.Messages = append(req.Messages,
				llm.Message{Role: llm.RoleAssistant, ToolCalls: []llm.ToolCall{{ID: "call_a", Name: "typed", Args: json.RawMessage(sent)}}},
				llm.Message{Role: llm.RoleTool, ToolCallID: "call_a", Content: "error: the city is closed", IsError: true})
			resp, err := f.call(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.ToolCalls) != 1 || !jsonEqual(t, string(resp.ToolCalls[0].Args), reply) {
				t.Errorf("reply's tool calls = %s, want arguments %s", fmt.Sprint(resp.ToolCalls), reply)
			}
			body := f.srv.Requests()[0].Body
			msgs, _ := body["messages"].([]any)
			tools, _ := body["tools"].([]any)
			tool, _ := tools[0].(map[string]any)
			var gotSchema any
			var gotArgs string
			switch k.provider {
			case llmtest.OpenAI:
				fn, _ := tool["function"].(map[string]any)
				gotSchema = fn["parameters"]
				asst, _ := msgs[len(msgs)-2].(map[string]any)
				calls, _ := asst["tool_calls"].([]any)
				c, _ := calls[0].(map[string]any)
				cf, _ := c["function"].(map[string]any)
				gotArgs, _ = cf["arguments"].(string)
			case llmtest.Anthropic:
				gotSchema = tool["input_schema"]
				asst, _ := msgs[len(msgs)-2].(map[string]any)
				blocks, _ := asst["content"].([]any)
				b, _ := blocks[0].(map[string]any)
				in, _ := json.Marshal(b["input"])
				gotArgs = string(in)
				last, _ := msgs[len(msgs)-1].(map[string]any)
				blocks, _ = last["content"].([]any)
				res, _ := blocks[0].(map[string]any)
				if res["type"] != "tool_result" || res["is_error"] != true {
					t.Errorf("tool result block = %v, want is_error true", res)
				}
			}
			s, _ := json.Marshal(gotSchema)
			if !jsonEqual(t, string(s), schema) {
				t.Errorf("schema sent = %s, want %s", s, schema)
			}
			if !jsonEqual(t, gotArgs, sent) {
				t.Errorf("arguments sent back = %s, want %s", gotArgs, sent)
			}
		})
	}
}

func jsonEqual(t *testing.T, a, b string) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal([]byte(a), &x); err != nil {
		t.Errorf("not JSON: %s: %v", a, err)
		return false
	}
	if err := json.Unmarshal([]byte(b), &y); err != nil {
		t.Fatalf("not JSON: %s: %v", b, err)
	}
	return reflect.DeepEqual(x, y)
}
