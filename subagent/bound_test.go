package subagent_test

import (
	"testing"

	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// TestLoopReservationBoundsWorstCaseUsage runs a task of several
// iterations with tools, in Japanese, on a model that bills one token per
// byte (the most a byte-level tokenizer can): every call's reported usage
// fits its reservation, so nothing is overrun, and the reservation is not
// much more than the usage either.
func TestLoopReservationBoundsWorstCaseUsage(t *testing.T) {
	t.Parallel()
	b := setup(t, 1_000_000, 50, map[string]int64{"a": 500_000})
	sim := newSim(t, llm.SimConfig{WorstCaseTokens: true, ToolCallsPerIteration: 2, FinishAfter: 4})
	loop := newLoop(b, sim) // 200 output tokens per call
	task := newTask(b, "a")
	task.Goal = "東京リージョンのマネージド PostgreSQL を比較する"
	task.Instruction = "三つのサービスの月額料金と p99 レイテンシを調べ、出典を付けてまとめてください 🐘"

	sum := loop.Run(t.Context(), task)

	if sum.Status != subagent.StatusSucceeded || sum.Iterations != 4 {
		t.Fatalf("status %s after %d iterations (err %v), want SUCCEEDED after 4", sum.Status, sum.Iterations, sum.Err)
	}
	res := b.reservations(t)
	byID := map[int64]reservation{}
	for _, r := range res {
		byID[r.ID] = r
	}
	calls := sim.Calls()
	if len(calls) != 4 || len(res) != 4 {
		t.Fatalf("%d calls, %d reservations; want 4 each", len(calls), len(res))
	}
	for _, c := range calls {
		r, ok := byID[c.ReservationID]
		if !ok {
			t.Fatalf("call %+v names no reservation", c)
		}
		if c.Usage.Total() > r.Amount || r.Overrun != 0 || r.Actual == nil || *r.Actual != c.Usage.Total() {
			t.Errorf("iteration %d: usage %+v (%d) over its reservation %+v", c.Iteration, c.Usage, c.Usage.Total(), r)
		}
		// Past the first call the bound comes from the reported usage; it
		// must stay close to the usage, not merely above it.
		if slack := r.Amount - int64(loop.MaxOutputTokens) - c.Usage.InputTokens; slack > c.Usage.InputTokens/10+64 {
			t.Errorf("iteration %d: reserved %d input tokens for %d billed: a loose bound", c.Iteration,
				r.Amount-int64(loop.MaxOutputTokens), c.Usage.InputTokens)
		}
	}
	if got := b.account(t, "a").Spent; got != sum.TokensSpent {
		t.Errorf("ledger spent %d, summary %d", got, sum.TokensSpent)
	}
	b.checkLedger(t)
}
