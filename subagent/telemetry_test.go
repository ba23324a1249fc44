package subagent_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
	"github.com/fanout/fanout/subagent/llm/llmtest"
)

// overbilling reports more input than any bound allows, as a provider with
// a wrong usage report, or a tokenizer the bound does not cover, would.
type overbilling struct {
	llm.Model
	extra int64
}

func (m overbilling) Call(ctx context.Context, req llm.Request) (llm.Response, error) {
	resp, err := m.Model.Call(ctx, req)
	resp.Usage.InputTokens += m.extra
	return resp, err
}

// The package's instruments bind to the first global meter provider
// installed, so it is installed once per test binary; TestLoopOverrunIsLoud
// and TestLoopCapturesContentOnlyWhenAsked read it, neither in parallel.
var (
	meterOnce   sync.Once
	meterReader *sdkmetric.ManualReader
)

func globalMeterReader() *sdkmetric.ManualReader {
	meterOnce.Do(func() {
		meterReader = sdkmetric.NewManualReader()
		otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(meterReader)))
	})
	return meterReader
}

// overrunTokens reads the fanout.subagent.overrun.tokens counter.
func overrunTokens(t *testing.T, reader *sdkmetric.ManualReader) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "fanout.subagent.overrun.tokens" {
				for _, p := range d.DataPoints {
					n += p.Value
				}
			}
		}
	}
	return n
}

// syncBuffer is a log sink safe for the loop's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLoopOverrunIsLoud has a model report more than its reservation: the
// ledger records the overrun, a warning names run, task, reservation,
// grant and usage, and fanout.subagent.overrun.tokens counts it. It
// installs the global meter provider, so it is the only test of the
// package that does and it does not call t.Parallel: it runs before the
// parallel tests resume, and what the counter gains meanwhile is its own.
func TestLoopOverrunIsLoud(t *testing.T) { //nolint:paralleltest // global meter provider
	reader := globalMeterReader()
	before := overrunTokens(t, reader)

	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	var logs syncBuffer
	loop := newLoop(b, overbilling{newSim(t, llm.SimConfig{FinishAfter: 1}), 100_000})
	loop.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	if sum := loop.Run(t.Context(), newTask(b, "a")); sum.Status != subagent.StatusSucceeded {
		t.Fatalf("status %s, err %v", sum.Status, sum.Err)
	}

	res := b.reservations(t)
	if len(res) != 1 || res[0].Actual == nil || res[0].Overrun != *res[0].Actual-res[0].Amount || res[0].Overrun <= 0 {
		t.Fatalf("reservations %+v: want one with its usage past the grant recorded as overrun", res)
	}
	r := res[0]
	var warned bool
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var line struct {
			Level, Msg               string
			RunID                    string `json:"run_id"`
			TaskID                   string `json:"task_id"`
			Reservation              int64
			Granted, Actual, Overrun int64
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line %s: %v", sc.Text(), err)
		}
		if strings.Contains(line.Msg, "reservation") && line.Level == "WARN" {
			warned = line.RunID == b.runID && line.TaskID == "a" && line.Reservation == r.ID &&
				line.Granted == r.Amount && line.Actual == *r.Actual && line.Overrun == r.Overrun
			if !warned {
				t.Errorf("overrun warning %s does not name run, task, reservation, grant and usage of %+v", sc.Text(), r)
			}
		}
	}
	if !warned {
		t.Errorf("no overrun warning in the logs:\n%s", logs.String())
	}
	if got := overrunTokens(t, reader) - before; got != r.Overrun {
		t.Errorf("fanout.subagent.overrun.tokens grew by %d, want the %d overrun", got, r.Overrun)
	}
	b.checkLedger(t)
}

// TestLoopCapturesContentOnlyWhenAsked checks the loop's spans with
// content capture off and on. It installs the global tracer provider, so
// it is the only test of the package that does and it does not call
// t.Parallel: it runs before the parallel tests resume.
func TestLoopCapturesContentOnlyWhenAsked(t *testing.T) { //nolint:paralleltest // global tracer provider
	spans := tracetest.NewInMemoryExporter()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans)))

	for _, capture := range []bool{false, true} {
		spans.Reset()
		b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
		loop := newLoop(b, newSim(t, llm.SimConfig{ToolCallsPerIteration: 1, FinishAfter: 2}))
		loop.CaptureContent = capture
		task := newTask(b, "a")
		task.AllowedTools = []string{"search"}
		if sum := loop.Run(t.Context(), task); sum.Err != nil {
			t.Fatal(sum.Err)
		}
		var agent, chats, tools int
		for _, s := range spans.GetSpans() {
			has := map[string]string{}
			for _, kv := range s.Attributes {
				has[string(kv.Key)] = kv.Value.String()
			}
			switch has["gen_ai.operation.name"] {
			case "invoke_agent":
				agent++
				if s.Name != "invoke_agent a" || has["fanout.task.status"] != "SUCCEEDED" || has["gen_ai.agent.name"] != "a" {
					t.Errorf("invoke_agent span %q: %v", s.Name, has)
				}
			case "chat":
				chats++
				for _, k := range []string{"gen_ai.input.messages", "gen_ai.output.messages"} {
					v, ok := has[k]
					if ok != capture {
						t.Errorf("capture %v: chat span has %s: %v", capture, k, ok)
					}
					if ok && !json.Valid([]byte(v)) {
						t.Errorf("%s is not JSON: %s", k, v)
					}
				}
			case "execute_tool":
				tools++
				if _, ok := has["gen_ai.tool.call.arguments"]; ok != capture {
					t.Errorf("capture %v: execute_tool span has arguments: %v", capture, ok)
				}
			}
		}
		if agent != 1 || chats != 2 || tools != 1 {
			t.Errorf("capture %v: %d invoke_agent, %d chat, %d execute_tool spans; want 1, 2, 1", capture, agent, chats, tools)
		}
	}

	// A structured-output model's compression call is a chat span too, a
	// child of invoke_agent with its own reservation.
	spans.Reset()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	_, model := newProviderModel(t, llmtest.OpenAI, false, agentScript(llmtest.Reply{Text: compressedFacts}))
	loop := newLoop(b, model)
	loop.CaptureContent = true
	if sum := loop.Run(t.Context(), newTask(b, "a")); sum.Err != nil || len(sum.Failed) != 0 {
		t.Fatalf("err %v, failed %q", sum.Err, sum.Failed)
	}
	var agentID trace.SpanID
	var chats []sdktrace.ReadOnlySpan
	for _, s := range spans.GetSpans().Snapshots() {
		switch attrOf(s, "gen_ai.operation.name") {
		case "invoke_agent":
			agentID = s.SpanContext().SpanID()
		case "chat":
			chats = append(chats, s)
		}
	}
	if len(chats) != 3 {
		t.Fatalf("%d chat spans, want 2 iterations and 1 compression", len(chats))
	}
	c := chats[2]
	if attrOf(c, "gen_ai.output.type") != "json" || attrOf(c, "fanout.budget.reservation_id") == "" ||
		attrOf(c, "gen_ai.usage.output_tokens") == "" || c.Parent().SpanID() != agentID {
		t.Errorf("compression span %q: %v, parent %s (agent %s)", c.Name(), c.Attributes(), c.Parent().SpanID(), agentID)
	}
	if !strings.Contains(attrOf(c, "gen_ai.input.messages"), "Compress everything above") ||
		!strings.Contains(attrOf(c, "gen_ai.output.messages"), "compressed fact") {
		t.Errorf("compression span content: %v", c.Attributes())
	}
	for _, s := range chats[:2] {
		if attrOf(s, "gen_ai.output.type") != "" {
			t.Errorf("iteration span %q has gen_ai.output.type", s.Name())
		}
	}

	checkNoKeyInSpans(t, spans)
}

func attrOf(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// checkNoKeyInSpans runs a loop on each real provider with a canary key and
// content capture on (the most a trace can hold), including an attempt that
// is retried and a call whose error echoes the key, and greps everything it
// wrote for any 8-byte piece of the key: every span, slog.Default() (which
// the loop and the provider log to when given no logger), the summary's
// errors and the metrics. Called from TestLoopCapturesContentOnlyWhenAsked,
// which owns the global tracer and, not being parallel, may swap the
// default logger.
func checkNoKeyInSpans(t *testing.T, spans *tracetest.InMemoryExporter) {
	t.Helper()
	// No 8-byte piece of it is hexadecimal only: it cannot pass for an id.
	const canary = "sk-canary-spans-Rq8Wz3Kx7Vm2Tn5Hb9Lj"
	var logs syncBuffer
	prev, prevOut, prevFlags := slog.Default(), log.Writer(), log.Flags()
	slog.SetDefault(slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer func() {
		slog.SetDefault(prev)
		log.SetOutput(prevOut)
		log.SetFlags(prevFlags)
	}()
	reader := globalMeterReader()
	for _, k := range providerKinds {
		spans.Reset()
		srv := llmtest.New(llmtest.Config{Provider: k.provider, Key: canary, Script: func(r llmtest.Request) llmtest.Reply {
			switch r.N {
			case 1: // retried: the provider logs the retry
				return llmtest.Reply{Status: 500, Message: "overloaded, key " + canary}
			case 3: // the compression call fails: the loop keeps the local facts and says why
				return llmtest.Reply{Status: 400, Message: "bad request for key " + canary}
			}
			return llmtest.Reply{Text: `{"facts": [{"text": "a fact", "sources": ["https://example.test/a"]}]}`}
		}})
		t.Cleanup(srv.Close)
		cfg := llm.ProviderConfig{APIKey: canary, BaseURL: srv.BaseURL(), Model: "test-model", CallTimeout: 10 * time.Second,
			Retry: llm.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}}
		var model llm.Model
		var err error
		if k.provider == llmtest.OpenAI {
			model, err = llm.NewOpenAI(llm.OpenAIConfig{ProviderConfig: cfg, Stream: k.stream})
		} else {
			model, err = llm.NewAnthropic(llm.AnthropicConfig{ProviderConfig: cfg})
		}
		if err != nil {
			t.Fatal(err)
		}
		b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
		loop := newLoop(b, model)
		loop.CaptureContent = true
		sum := loop.Run(t.Context(), newTask(b, "a"))
		if n := len(srv.Requests()); n != 3 {
			t.Errorf("%s: the provider saw %d requests, want 3 (a retried attempt, the answer, the failed compression)", k.name, n)
		}
		if len(sum.Failed) == 0 || !strings.Contains(strings.Join(sum.Failed, " "), "[REDACTED]") {
			t.Errorf("%s: summary failures %q: want the compression's error, with the echoed key redacted", k.name, sum.Failed)
		}
		if len(spans.GetSpans()) == 0 {
			t.Fatalf("%s: no spans recorded", k.name)
		}
		for _, s := range spans.GetSpans().Snapshots() {
			var text strings.Builder
			text.WriteString(s.Name() + " " + s.Status().Description)
			for _, kv := range s.Attributes() {
				text.WriteString(" " + string(kv.Key) + "=" + kv.Value.String())
			}
			for _, ev := range s.Events() {
				text.WriteString(" " + ev.Name)
				for _, kv := range ev.Attributes {
					text.WriteString(" " + string(kv.Key) + "=" + kv.Value.String())
				}
			}
			if p, ok := llmtest.LeakedPiece(text.String(), canary); ok {
				t.Errorf("%s: span %q holds a piece of the API key (%q): %s", k.name, s.Name(), p, text.String())
			}
		}
		errs := fmt.Sprintf("%v | %+v | %q", sum.Err, sum.Err, sum.Failed)
		if p, ok := llmtest.LeakedPiece(errs, canary); ok {
			t.Errorf("%s: the summary's errors hold a piece of the API key (%q): %s", k.name, p, errs)
		}
	}
	if !strings.Contains(logs.String(), "model call retried") {
		t.Errorf("slog.Default() got no retry warning: the grep below would not see the provider's logs:\n%s", logs.String())
	}
	if p, ok := llmtest.LeakedPiece(logs.String(), canary); ok {
		t.Errorf("slog.Default() got a piece of the API key (%q):\n%s", p, llmtest.LinesHolding(logs.String(), p))
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	text := llmtest.MetricsText(rm)
	if !strings.Contains(text, "fanout.subagent") {
		t.Errorf("the metrics hold no fanout.subagent series: the grep below would see nothing:\n%s", text)
	}
	if p, ok := llmtest.LeakedPiece(text, canary); ok {
		t.Errorf("the metrics hold a piece of the API key (%q):\n%s", p, llmtest.LinesHolding(text, p))
	}
}
