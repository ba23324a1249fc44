package subagent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// asksAgain replies with the same call in each of its first n iterations
// (a new call id each time, as a model does), then stops with a fact.
type asksAgain struct {
	call llm.ToolCall
	n    int
	mu   sync.Mutex
	reqs []llm.Request
}

func (a *asksAgain) Name() string { return "asks-again" }

func (a *asksAgain) Call(_ context.Context, req llm.Request) (llm.Response, error) {
	a.mu.Lock()
	a.reqs = append(a.reqs, req)
	a.mu.Unlock()
	usage := llm.Usage{InputTokens: 100, OutputTokens: 20}
	if req.Meta.Iteration <= a.n {
		c := a.call
		c.ID = fmt.Sprintf("c-it%d", req.Meta.Iteration)
		return llm.Response{ToolCalls: []llm.ToolCall{c}, Usage: usage, FinishReason: llm.FinishToolCalls}, nil
	}
	return llm.Response{Content: `{"facts":[{"text":"done","sources":["x"]}]}`, Usage: usage, FinishReason: llm.FinishStop}, nil
}

// lastResult is the tool result the model was shown in request i (0-based).
func (a *asksAgain) lastResult(t *testing.T, i int) llm.Message {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if i >= len(a.reqs) {
		t.Fatalf("the model was called %d times, want at least %d", len(a.reqs), i+1)
	}
	msgs := a.reqs[i].Messages
	for j := len(msgs) - 1; j >= 0; j-- {
		if msgs[j].Role == llm.RoleTool {
			return msgs[j]
		}
	}
	t.Fatalf("request %d shows no tool result", i)
	return llm.Message{}
}

// TestAWriteIsSentOncePerTaskWhenTheModelAsksAgain (issue 28, from a
// security review): within one attempt, a write the model asks for again
// in a later iteration, with the same tool and arguments, is never sent
// again under another key. A cut-off write (its call timed out: it may
// have happened) was sent once per ask, under …/i1/c0, …/i2/c0, …/i3/c0;
// a done write too. The model is told what became of the first one.
func TestAWriteIsSentOncePerTaskWhenTheModelAsksAgain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		tool    func(sent func(string)) subagent.Tool
		says    string
		isError bool
		state   runs.WriteState
	}{
		{"cut off", func(sent func(string)) subagent.Tool {
			return subagent.Tool{Name: "charge", Effect: subagent.EffectWrite, Timeout: 200 * time.Millisecond,
				Func: func(ctx context.Context, c subagent.ToolCall) (subagent.ToolResult, error) {
					sent(c.IdempotencyKey)
					<-ctx.Done() // the server never answers in time
					return subagent.ToolResult{}, context.Cause(ctx)
				}}
		}, "may have happened", true, runs.WriteUnknown},
		{"done", func(sent func(string)) subagent.Tool {
			return subagent.Tool{Name: "charge", Effect: subagent.EffectWrite,
				Func: func(_ context.Context, c subagent.ToolCall) (subagent.ToolResult, error) {
					sent(c.IdempotencyKey)
					return subagent.ToolResult{Text: "charged 12 EUR"}, nil
				}}
		}, "charged 12 EUR", false, runs.WriteDone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
			var mu sync.Mutex
			var keys []string
			tool := tc.tool(func(k string) { mu.Lock(); keys = append(keys, k); mu.Unlock() })
			m := &asksAgain{call: llm.ToolCall{Name: "charge", Args: json.RawMessage(`{"amount": 12, "to": "acct-9"}`)}, n: 3}
			loop, task := toolLoop(t, b, m, tool)
			loop.Writes = store.NewToolCalls(b.pool, store.ToolCallsConfig{})
			task.Attempt = 1

			out := loop.Run(t.Context(), task)

			if out.Status != subagent.StatusSucceeded {
				t.Fatalf("status %s, err %v", out.Status, out.Err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(keys) != 1 {
				t.Errorf("the write was sent %d times, under %q; want once", len(keys), keys)
			}
			for i := 2; i <= 3; i++ { // the results shown after the 2nd and 3rd asks
				r := m.lastResult(t, i)
				if !strings.Contains(r.Content, "not sent again") || !strings.Contains(r.Content, tc.says) || r.IsError != tc.isError {
					t.Errorf("ask %d: the model was shown %+v; want \"not sent again\" and %q (error %v)", i, r, tc.says, tc.isError)
				}
			}
			ws, err := loop.Writes.Writes(t.Context(), "t1", b.runID, "a", "")
			if err != nil {
				t.Fatal(err)
			}
			if len(ws) != 1 || ws[0].State != tc.state {
				t.Errorf("tool_call rows = %+v; want one, %s", ws, tc.state)
			}
		})
	}
}
