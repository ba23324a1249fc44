package subagent_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// TestWoundDownTaskAnswersWithoutTools: the task is wound down (its run's
// orchestrator says so in the ledger, as the forecast decides) after its
// first iteration. The next grant says so, and that iteration is
// the task's last: its call offers no tool and is told to answer, no tool
// runs after it, no compression call follows, and the task hands back what
// it found by then as SUCCEEDED, marked wound down; billed a token per
// byte, every call stays within its grant.
func TestWoundDownTaskAnswersWithoutTools(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	// Usage as the worst tokenizer bills it (a token per byte): the
	// wound-down call, with the message and without the tools, must stay
	// within what its grant reserved for it.
	sim := newSim(t, llm.SimConfig{ToolCallsPerIteration: 2, FinishAfter: 4, Facts: 3, WorstCaseTokens: true})
	rec := &recordingSim{Sim: sim} // a structured model: a compression call would be made
	loop := newLoop(b, rec)
	loop.ProgressFunc = func(p subagent.Progress) {
		if p.Iteration == 1 { // before the task asks for its next grant
			if err := b.ledger.WindDown(t.Context(), b.runID, 0, []string{"a"}); err != nil {
				t.Error(err)
			}
		}
	}

	sum := loop.Run(t.Context(), newTask(b, "a"))

	if sum.Status != subagent.StatusSucceeded || !sum.WoundDown || sum.Iterations != 2 {
		t.Fatalf("status %s, wound down %v, %d iterations (err %v); want SUCCEEDED, wound down, after 2",
			sum.Status, sum.WoundDown, sum.Iterations, sum.Err)
	}
	if len(sum.Tried) != 2 {
		t.Errorf("tried %q; want only the first iteration's 2 tool calls", sum.Tried)
	}
	reqs := rec.requests()
	if len(reqs) != 2 || rec.compressions.Load() != 0 {
		t.Fatalf("%d iteration calls, %d compression calls; want 2 and none after a wind-down", len(reqs), rec.compressions.Load())
	}
	last := reqs[1]
	if len(last.Tools) != 0 {
		t.Errorf("the wound-down call offered %d tools; want none", len(last.Tools))
	}
	if m := last.Messages[len(last.Messages)-1]; !strings.Contains(m.Content, "last turn") {
		t.Errorf("the wound-down call's last message is %q; want it told to answer now", m.Content)
	}
	if len(sum.Facts) == 0 {
		t.Error("no facts: a wound-down task hands back what it found")
	}
	for _, r := range b.reservations(t) {
		if r.Overrun != 0 || r.Estimated || r.State != "settled" {
			t.Errorf("reservation %+v: want settled with reported usage within its grant", r)
		}
	}
	if got := b.account(t, "a").Spent; got != sum.TokensSpent {
		t.Errorf("ledger spent %d, summary says %d", got, sum.TokensSpent)
	}
}

// recordingSim is a Sim that keeps the requests of its iteration calls,
// and a structured model whose compression calls it counts (the sim's
// final answer is a fact summary).
type recordingSim struct {
	*llm.Sim
	mu           sync.Mutex
	reqs         []llm.Request
	compressions atomic.Int64
}

func (r *recordingSim) CallStructured(ctx context.Context, req llm.Request, _ llm.Schema) (llm.Response, error) {
	r.compressions.Add(1)
	return r.Sim.Call(ctx, req)
}

func (r *recordingSim) Call(ctx context.Context, req llm.Request) (llm.Response, error) {
	r.mu.Lock()
	r.reqs = append(r.reqs, req)
	r.mu.Unlock()
	return r.Sim.Call(ctx, req)
}

func (r *recordingSim) requests() []llm.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]llm.Request(nil), r.reqs...)
}
