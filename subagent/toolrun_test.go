package subagent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// scripted is a model whose first reply is calls and whose later replies
// are a final answer; it keeps every request.
type scripted struct {
	calls []llm.ToolCall
	mu    sync.Mutex
	reqs  []llm.Request
}

func (s *scripted) Name() string { return "scripted" }

func (s *scripted) Call(_ context.Context, req llm.Request) (llm.Response, error) {
	s.mu.Lock()
	s.reqs = append(s.reqs, req)
	s.mu.Unlock()
	usage := llm.Usage{InputTokens: 100, OutputTokens: 20}
	if req.Meta.Iteration == 1 {
		return llm.Response{ToolCalls: s.calls, Usage: usage, FinishReason: llm.FinishToolCalls}, nil
	}
	return llm.Response{Content: `{"facts":[{"text":"done","sources":["x"]}]}`, Usage: usage, FinishReason: llm.FinishStop}, nil
}

// results are the tool messages the model was shown after its first reply.
func (s *scripted) results(t *testing.T) []llm.Message {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.reqs) < 2 {
		t.Fatalf("the model was called %d times, want a second call with the tool results", len(s.reqs))
	}
	var out []llm.Message
	for _, m := range s.reqs[1].Messages {
		if m.Role == llm.RoleTool {
			out = append(out, m)
		}
	}
	return out
}

func calls(names ...string) []llm.ToolCall {
	out := make([]llm.ToolCall, len(names))
	for i, n := range names {
		out[i] = llm.ToolCall{ID: fmt.Sprintf("c%d", i), Name: n, Args: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
	}
	return out
}

// recorder is a tool that records the calls it ran, in order.
type recorder struct {
	mu  sync.Mutex
	ran []string
}

func (r *recorder) tool(name string, effect subagent.Effect, res subagent.ToolResult) subagent.Tool {
	return subagent.Tool{Name: name, Effect: effect, Func: func(ctx context.Context, c subagent.ToolCall) (subagent.ToolResult, error) {
		r.mu.Lock()
		r.ran = append(r.ran, name+string(c.Args))
		r.mu.Unlock()
		return res, nil
	}}
}

func (r *recorder) calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.ran...)
}

func toolLoop(t *testing.T, b *bundle, m llm.Model, tools ...subagent.Tool) (*subagent.Loop, subagent.Task) {
	t.Helper()
	reg, err := subagent.NewTools(tools...)
	if err != nil {
		t.Fatal(err)
	}
	loop := newLoop(b, m)
	loop.Tools = reg
	task := newTask(b, "a")
	task.AllowedTools = nil
	for _, tool := range tools {
		task.AllowedTools = append(task.AllowedTools, tool.Name)
	}
	return loop, task
}

// TestToolCallsOverTheTurnCapAreAnswered: a reply of 11 calls runs the
// first 8; the other 3 are answered "not run", none dropped.
func TestToolCallsOverTheTurnCapAreAnswered(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	var rec recorder
	names := make([]string, 11)
	for i := range names {
		names[i] = "r"
	}
	m := &scripted{calls: calls(names...)}
	loop, task := toolLoop(t, b, m, rec.tool("r", subagent.EffectRead, subagent.ToolResult{Text: "ok"}))

	sum := loop.Run(t.Context(), task)

	if sum.Status != subagent.StatusSucceeded {
		t.Fatalf("status %s, err %v", sum.Status, sum.Err)
	}
	if n := len(rec.calls()); n != subagent.DefaultMaxToolCallsPerTurn {
		t.Errorf("%d calls ran, want the cap, %d", n, subagent.DefaultMaxToolCallsPerTurn)
	}
	res := m.results(t)
	if len(res) != 11 {
		t.Fatalf("the model got %d tool results for 11 calls", len(res))
	}
	for i, r := range res {
		over := i >= subagent.DefaultMaxToolCallsPerTurn
		if r.ToolCallID != fmt.Sprintf("c%d", i) || over != strings.Contains(r.Content, "not run: over the per-turn cap of 8") || over != r.IsError {
			t.Errorf("result %d = %+v", i, r)
		}
	}
	if sys := m.reqs[0].Messages[0].Content; !strings.Contains(sys, "independent tools together in one reply") ||
		!strings.Contains(sys, "proceed without it") {
		t.Errorf("the system prompt says nothing of parallel calls or failed ones: %q", sys)
	}
}

// TestFailedWriteStopsTheTurnsLaterWrites: after a write reports an error,
// the later writes of the reply are not run (reads still are).
func TestFailedWriteStopsTheTurnsLaterWrites(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	var rec recorder
	m := &scripted{calls: calls("ok", "bad", "read", "ok", "ok")}
	loop, task := toolLoop(t, b, m,
		rec.tool("ok", subagent.EffectWrite, subagent.ToolResult{Text: "written"}),
		rec.tool("bad", subagent.EffectWrite, subagent.ToolResult{Text: "disk full", IsError: true}),
		rec.tool("read", subagent.EffectRead, subagent.ToolResult{Text: "read"}))

	sum := loop.Run(t.Context(), task)

	if got, want := strings.Join(rec.calls(), " "), `ok{"i":0} bad{"i":1} read{"i":2}`; got != want {
		t.Errorf("ran %s, want %s", got, want)
	}
	res := m.results(t)
	for i, want := range []string{"written", "error: disk full", "read", "not run: an earlier write in this reply failed", "not run: an earlier write in this reply failed"} {
		if res[i].Content != want || res[i].IsError != (i == 1 || i >= 3) {
			t.Errorf("result %d = %q (is_error %t), want %q", i, res[i].Content, res[i].IsError, want)
		}
	}
	if !strings.Contains(strings.Join(sum.Failed, "\n"), "the tool reported an error: disk full") {
		t.Errorf("summary's failures %q do not name the failed write", sum.Failed)
	}
}

// TestHungToolIsCutOffByItsTimeout: a tool that never answers is cut off by
// its own timeout, its call's result says so, the server-side context is
// done, and the other read's result is kept.
func TestHungToolIsCutOffByItsTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	cut := make(chan error, 1)
	hung := subagent.Tool{Name: "hung", Effect: subagent.EffectRead, Timeout: 100 * time.Millisecond,
		Func: func(ctx context.Context, _ subagent.ToolCall) (subagent.ToolResult, error) {
			<-ctx.Done()
			cut <- context.Cause(ctx)
			return subagent.ToolResult{}, ctx.Err()
		}}
	var rec recorder
	m := &scripted{calls: calls("hung", "fine")}
	loop, task := toolLoop(t, b, m, hung, rec.tool("fine", subagent.EffectRead, subagent.ToolResult{Text: "fine result"}))

	start := time.Now()
	sum := loop.Run(within(t), task)

	if sum.Status != subagent.StatusSucceeded {
		t.Fatalf("status %s, err %v: a timed-out call must not end the task", sum.Status, sum.Err)
	}
	if d := time.Since(start); d > patience {
		t.Errorf("the task took %v", d)
	}
	select {
	case err := <-cut:
		if err == nil || !strings.Contains(err.Error(), "timed out") {
			t.Errorf("the hung tool's context ended with %v, want the tool timeout", err)
		}
	default:
		t.Error("the hung tool's context was never done")
	}
	res := m.results(t)
	if res[0].Content != "error: timed out after 100ms: proceed without it" || !res[0].IsError || res[1].Content != "fine result" {
		t.Errorf("results %+v", res)
	}
}

// TestUndeclaredEffectIsAWrite: a tool registered without an Effect runs
// alone, with an idempotency key, as a write.
func TestUndeclaredEffectIsAWrite(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	var running, most atomic.Int32
	var keys sync.Map
	tool := subagent.Tool{Name: "undeclared", Func: func(ctx context.Context, c subagent.ToolCall) (subagent.ToolResult, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		keys.Store(c.IdempotencyKey, true)
		return subagent.ToolResult{Text: "ok"}, nil
	}}
	m := &scripted{calls: calls("undeclared", "undeclared", "undeclared")}
	loop, task := toolLoop(t, b, m, tool)

	loop.Run(t.Context(), task)

	n := 0
	keys.Range(func(k, _ any) bool {
		if k != "" {
			n++
		}
		return true
	})
	if most.Load() != 1 || n != 3 {
		t.Errorf("%d ran at once, %d distinct keys; want 1 at a time, 3 keys (a write)", most.Load(), n)
	}
}

// TestRedispatchedTaskDoesNotResendAWrite: attempt 1 of a task makes a
// write that succeeds and another that is cut off in flight, then the
// worker is gone (its context cancelled). Attempt 2 makes the same calls:
// neither is sent again; the model is told the earlier outcomes, in its
// prompt and as the calls' results, and the cut-off one "may have
// happened" in both attempts' summaries. The tool_call rows say so too.
func TestRedispatchedTaskDoesNotResendAWrite(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	log := store.NewToolCalls(b.pool, store.ToolCallsConfig{})
	var sent sync.Map // idempotency key -> tool name
	ctx, gone := context.WithCancelCause(t.Context())
	okTool := subagent.Tool{Name: "ok", Effect: subagent.EffectWrite,
		Func: func(_ context.Context, c subagent.ToolCall) (subagent.ToolResult, error) {
			sent.Store(c.IdempotencyKey, "ok")
			return subagent.ToolResult{Text: "row 42 inserted"}, nil
		}}
	cutTool := subagent.Tool{Name: "cut", Effect: subagent.EffectWrite,
		Func: func(ctx context.Context, c subagent.ToolCall) (subagent.ToolResult, error) {
			sent.Store(c.IdempotencyKey, "cut")
			gone(errors.New("the worker is gone")) // mid-call
			<-ctx.Done()
			return subagent.ToolResult{}, context.Cause(ctx)
		}}
	script := []llm.ToolCall{
		{ID: "c0", Name: "ok", Args: json.RawMessage(`{"row": 42, "tags": ["a"]}`)},
		{ID: "c1", Name: "cut", Args: json.RawMessage(`{"row": 43}`)},
	}
	m1 := &scripted{calls: script}
	loop, task := toolLoop(t, b, m1, okTool, cutTool)
	loop.Writes = log

	first := loop.Run(ctx, task)

	if first.Status != subagent.StatusCancelled {
		t.Fatalf("attempt 1: status %s, err %v; want CANCELLED", first.Status, first.Err)
	}
	if !strings.Contains(strings.Join(first.Failed, "\n"), "cut({\"row\":43}): may have happened") {
		t.Errorf("attempt 1's summary does not say the cut-off write may have happened: %q", first.Failed)
	}
	if n, err := b.ledger.BeginAttempt(t.Context(), task.Account, b.runID, "t1"); err != nil || n.N != 2 {
		t.Fatalf("begin attempt 2: %d, %v", n.N, err)
	}
	task.Attempt = 2
	m2 := &scripted{calls: []llm.ToolCall{ // the same calls, written differently
		{ID: "d0", Name: "ok", Args: json.RawMessage(`{"tags":["a"],"row":42}`)},
		{ID: "d1", Name: "cut", Args: json.RawMessage(`{"row":43}`)},
	}}
	loop.Model = m2

	second := loop.Run(t.Context(), task)

	if second.Status != subagent.StatusSucceeded {
		t.Fatalf("attempt 2: status %s, err %v", second.Status, second.Err)
	}
	n := 0
	sent.Range(func(k, v any) bool { n++; return true })
	if n != 2 {
		t.Errorf("%d writes were sent in both attempts, want 2: attempt 2 sent one again", n)
	}
	prompt := m2.reqs[0].Messages
	if p := prompt[len(prompt)-2].Content; !strings.Contains(p, "- ok: done: row 42 inserted") || !strings.Contains(p, "- cut: unknown (may have happened)") {
		t.Errorf("attempt 2's prompt does not list the earlier writes: %q", p)
	}
	res := m2.results(t)
	if !strings.Contains(res[0].Content, "not sent again") || !strings.Contains(res[0].Content, "row 42 inserted") || res[0].IsError {
		t.Errorf("attempt 2's result of the done write = %+v", res[0])
	}
	if !strings.Contains(res[1].Content, "not sent again") || !strings.Contains(res[1].Content, "may have happened") || !res[1].IsError {
		t.Errorf("attempt 2's result of the cut-off write = %+v", res[1])
	}
	ws, err := log.Writes(t.Context(), "t1", b.runID, "a", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 || ws[0].State != runs.WriteDone || ws[1].State != runs.WriteUnknown || ws[0].Attempt != 1 || ws[1].Attempt != 1 {
		t.Errorf("tool_call rows = %+v, want attempt 1's done and unknown writes only", ws)
	}
}

// TestWriteNeverSentMayBeSentByALaterAttempt: a write whose tool said it
// never sent it (ErrNotSent: a slot wait that ended, no session) is
// not_sent in its row, and a later attempt sends it: it never happened.
func TestWriteNeverSentMayBeSentByALaterAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	log := store.NewToolCalls(b.pool, store.ToolCallsConfig{})
	var sends atomic.Int32
	refuse := atomic.Bool{}
	refuse.Store(true)
	tool := subagent.Tool{Name: "w", Effect: subagent.EffectWrite,
		Func: func(_ context.Context, _ subagent.ToolCall) (subagent.ToolResult, error) {
			if refuse.Load() {
				return subagent.ToolResult{}, fmt.Errorf("no slot within the call's timeout: %w", subagent.ErrNotSent)
			}
			sends.Add(1)
			return subagent.ToolResult{Text: "written"}, nil
		}}
	loop, task := toolLoop(t, b, &scripted{calls: calls("w")}, tool)
	loop.Writes = log
	loop.Run(t.Context(), task)
	ws, err := log.Writes(t.Context(), "t1", b.runID, "a", "")
	if err != nil || len(ws) != 1 || ws[0].State != runs.WriteNotSent || !strings.Contains(ws[0].Error, "no slot") {
		t.Fatalf("attempt 1's rows %+v (%v), want one write not_sent, saying why", ws, err)
	}

	if _, err := b.ledger.BeginAttempt(t.Context(), task.Account, b.runID, "t1"); err != nil {
		t.Fatal(err)
	}
	task.Attempt = 2
	refuse.Store(false)
	loop.Model = &scripted{calls: calls("w")}
	loop.Run(t.Context(), task)
	if n := sends.Load(); n != 1 {
		t.Errorf("attempt 2 sent the write %d times, want once: attempt 1's never reached the tool", n)
	}
}
