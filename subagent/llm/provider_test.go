package llm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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
	return newFixtureOn(t, k, llmtest.Config{Script: script}, tune)
}

// newFixtureOn is newFixture on a server configured by sc (its Provider
// and Key are the fixture's).
func newFixtureOn(t *testing.T, k kind, sc llmtest.Config, tune func(*llm.ProviderConfig)) *fixture {
	t.Helper()
	sc.Provider, sc.Key = k.provider, canary
	srv := llmtest.New(sc)
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
