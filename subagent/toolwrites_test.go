package subagent_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// TestSupersededAttemptDoesNotSendAWriteTheNewAttemptAlsoSends (review of
// issue 13): attempt 1 of a task is in its tool phase — a slow read, then
// a write, in one reply — when the orchestrator begins attempt 2 (adoption
// after a lost orchestrator fences the task's account with BeginAttempt;
// attempt 1's worker never heard, as in a partition). Attempt 2 reads the
// earlier attempts' writes (none yet), makes the same calls and sends the
// write. Then attempt 1's read returns and attempt 1 sends the write too:
// it holds no reservation during tools, and IssueWrite does not check that
// its attempt is still the account's current one. The write must reach the
// tool once.
func TestSupersededAttemptDoesNotSendAWriteTheNewAttemptAlsoSends(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	log := store.NewToolCalls(b.pool, store.ToolCallsConfig{})

	var mu sync.Mutex
	var sentKeys []string
	inRead := make(chan struct{})
	release := make(chan struct{})
	var reads atomic.Int64
	slowRead := subagent.Tool{Name: "lookup", Effect: subagent.EffectRead,
		Func: func(ctx context.Context, _ subagent.ToolCall) (subagent.ToolResult, error) {
			if reads.Add(1) == 1 { // attempt 1's read: slow
				close(inRead)
				select {
				case <-release:
				case <-ctx.Done():
					return subagent.ToolResult{}, context.Cause(ctx)
				}
			}
			return subagent.ToolResult{Text: "customer 7 exists"}, nil
		}}
	write := subagent.Tool{Name: "charge", Effect: subagent.EffectWrite,
		Func: func(_ context.Context, c subagent.ToolCall) (subagent.ToolResult, error) {
			mu.Lock()
			sentKeys = append(sentKeys, c.IdempotencyKey)
			mu.Unlock()
			return subagent.ToolResult{Text: "charged 10 EUR"}, nil
		}}
	script := []llm.ToolCall{
		{ID: "c0", Name: "lookup", Args: json.RawMessage(`{"customer":7}`)},
		{ID: "c1", Name: "charge", Args: json.RawMessage(`{"customer":7,"eur":10}`)},
	}
	loop, task := toolLoop(t, b, &scripted{calls: script}, slowRead, write)
	loop.Writes = log

	wait1 := goRun(t, t.Context(), loop, task) // attempt 1
	await(t, inRead, "attempt 1 reached its slow read")

	// The orchestrator re-dispatches: attempt 2 begins and runs to its end.
	if n, err := b.ledger.BeginAttempt(t.Context(), task.Account, b.runID, "t1"); err != nil || n.N != 2 {
		t.Fatalf("begin attempt 2: %d, %v", n.N, err)
	}
	task2 := task
	task2.Attempt = 2
	loop2 := *loop
	loop2.Model = &scripted{calls: script}
	if sum := loop2.Run(t.Context(), task2); sum.Status != subagent.StatusSucceeded {
		t.Fatalf("attempt 2: status %s, err %v", sum.Status, sum.Err)
	}

	close(release) // attempt 1's read returns; its turn goes on to the write
	first := wait1("attempt 1 ended")

	mu.Lock()
	defer mu.Unlock()
	if len(sentKeys) != 1 {
		t.Errorf("the write reached the tool %d times (keys %q), want once; attempt 1 ended %s (%v)",
			len(sentKeys), sentKeys, first.Status, first.Err)
	}
}

// TestToolResultTextStaysOffSpansWithoutCapture (review of issue 13): with
// CaptureContent off, a tool's result is content the tenant may not want in
// a tracing backend (Loop.CaptureContent's doc). A result the tool marks
// IsError is a result too: its text must not reach the span's status,
// attributes or events. It installs the global tracer provider, so it does
// not call t.Parallel (as TestLoopCapturesContentOnlyWhenAsked).
func TestToolResultTextStaysOffSpansWithoutCapture(t *testing.T) { //nolint:paralleltest // global tracer provider
	spans := tracetest.NewInMemoryExporter()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans)))
	const secret = "card 4111-1111-1111-1111 of jane@example.com declined"
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	failing := subagent.Tool{Name: "pay", Effect: subagent.EffectRead,
		Func: func(context.Context, subagent.ToolCall) (subagent.ToolResult, error) {
			return subagent.ToolResult{Text: secret, IsError: true}, nil
		}}
	loop, task := toolLoop(t, b, &scripted{calls: calls("pay")}, failing)
	loop.CaptureContent = false
	if sum := loop.Run(t.Context(), task); sum.Status != subagent.StatusSucceeded {
		t.Fatalf("status %s, err %v", sum.Status, sum.Err)
	}
	found := 0
	for _, s := range spans.GetSpans() {
		if s.Name != "execute_tool pay" {
			continue
		}
		found++
		if strings.Contains(s.Status.Description, "4111") {
			t.Errorf("span %q status holds the tool's result: %q", s.Name, s.Status.Description)
		}
		for _, kv := range s.Attributes {
			if strings.Contains(kv.Value.String(), "4111") {
				t.Errorf("span %q attribute %s holds the tool's result: %q", s.Name, kv.Key, kv.Value.String())
			}
		}
		for _, ev := range s.Events {
			for _, kv := range ev.Attributes {
				if strings.Contains(kv.Value.String(), "4111") {
					t.Errorf("span %q event %s attribute %s holds the tool's result", s.Name, ev.Name, kv.Key)
				}
			}
		}
	}
	if found != 1 {
		t.Fatalf("%d execute_tool pay spans, want 1", found)
	}
}

// TestDifferentLargeIntegerArgumentsAreDifferentWrites (review of issue 13):
// the argument digest that matches a later attempt's write to an earlier
// one decodes numbers as float64, so two ids past 2^53 (snowflake ids,
// order numbers) that differ in their last digits digest alike. Attempt 2's
// write for order ...788 is then "not sent again" and answered with
// attempt 1's result for order ...789: a write reported done that never
// happened.
func TestDifferentLargeIntegerArgumentsAreDifferentWrites(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	log := store.NewToolCalls(b.pool, store.ToolCallsConfig{})
	var mu sync.Mutex
	var sent []string
	refund := subagent.Tool{Name: "refund", Effect: subagent.EffectWrite,
		Func: func(_ context.Context, c subagent.ToolCall) (subagent.ToolResult, error) {
			mu.Lock()
			sent = append(sent, string(c.Args))
			mu.Unlock()
			return subagent.ToolResult{Text: "refunded " + string(c.Args)}, nil
		}}
	m1 := &scripted{calls: []llm.ToolCall{{ID: "c0", Name: "refund", Args: json.RawMessage(`{"order":1234567890123456789}`)}}}
	loop, task := toolLoop(t, b, m1, refund)
	loop.Writes = log
	if sum := loop.Run(t.Context(), task); sum.Status != subagent.StatusSucceeded {
		t.Fatalf("attempt 1: %s %v", sum.Status, sum.Err)
	}
	if n, err := b.ledger.BeginAttempt(t.Context(), task.Account, b.runID, "t1"); err != nil || n.N != 2 {
		t.Fatalf("begin attempt 2: %d, %v", n.N, err)
	}
	task.Attempt = 2
	m2 := &scripted{calls: []llm.ToolCall{{ID: "d0", Name: "refund", Args: json.RawMessage(`{"order":1234567890123456788}`)}}}
	loop.Model = m2
	if sum := loop.Run(t.Context(), task); sum.Status != subagent.StatusSucceeded {
		t.Fatalf("attempt 2: %s %v", sum.Status, sum.Err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 2 {
		t.Errorf("sent %q; want both orders' refunds sent (attempt 2 was shown %q)", sent, m2.results(t)[0].Content)
	}
}
