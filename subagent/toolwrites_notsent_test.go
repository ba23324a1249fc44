package subagent_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent"
)

// TestToolErrorTextSayingNotSentIsNotProofOfNotSent (review of issue 13's
// fixes): a write that reached its tool and was answered isError with a
// text of the tool's own that starts "not sent: " (an email tool: "not
// sent: mailbox full") is failed in its row with that text as its error,
// which loadPrior takes for the mark of a write that never reached the
// tool: a later attempt sends it again, under a new key.
func TestToolErrorTextSayingNotSentIsNotProofOfNotSent(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	log := store.NewToolCalls(b.pool, store.ToolCallsConfig{})
	var sends atomic.Int32
	tool := subagent.Tool{Name: "w", Effect: subagent.EffectWrite,
		Func: func(_ context.Context, _ subagent.ToolCall) (subagent.ToolResult, error) {
			sends.Add(1) // it reached the tool
			return subagent.ToolResult{Text: "not sent: the recipient's mailbox is full", IsError: true}, nil
		}}
	loop, task := toolLoop(t, b, &scripted{calls: calls("w")}, tool)
	loop.Writes = log
	loop.Run(t.Context(), task)
	if n := sends.Load(); n != 1 {
		t.Fatalf("attempt 1 sent the write %d times, want once", n)
	}

	if _, err := b.ledger.BeginAttempt(t.Context(), task.Account, b.runID, "t1"); err != nil {
		t.Fatal(err)
	}
	task.Attempt = 2
	loop.Model = &scripted{calls: calls("w")}
	loop.Run(t.Context(), task)
	if n := sends.Load(); n != 1 {
		ws, err := log.Writes(t.Context(), "t1", b.runID, "a", "")
		t.Errorf("the write reached the tool %d times, want once: attempt 1's reached it and was answered "+
			"(rows %+v, %v)", n, ws, err)
	}
}
