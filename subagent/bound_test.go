package subagent_test

import (
	"testing"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
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

// TestPartialGrantShrinksMaxTokens: every call is paid before it is made
// (I1), also when the ledger grants less than the loop asked for. A worker
// configured as a worker process configures it runs a task whose account
// (3,000 tokens) holds less than each call's input bound plus the 4,096
// output tokens its dispatch allows per call, but more than the minimum
// reservation: both iterations get partial grants, and each call's
// max_tokens must be what its grant leaves after the input bound, exactly
// the loop's rule min(grant - input bound, allowance), with the input
// bound the loop's own (llm.Estimator: every byte of the first prompt,
// then the last reported usage plus what was appended since; for a call
// that offers tools, the larger of that and the bound of the same call
// wound down, without tools and with subagent.WindDownMessage), recomputed
// here from the requests and the reported usage.
func TestPartialGrantShrinksMaxTokens(t *testing.T) {
	t.Parallel()
	const allowance, taskLimit, minReservation = 4096, 3000, 50
	b := setup(t, 1_000_000, minReservation, map[string]int64{"a": taskLimit})
	sim := newSim(t, llm.SimConfig{ToolCallsPerIteration: 2, FinishAfter: 2, InputTokens: 100, OutputTokens: 50})
	model := newGated(sim)
	close(model.release)
	client := serve(t, workerServer(t, b, model, nil, nil))
	d := request(b, "a")
	d.MinReservationTokens = minReservation
	d.Model.MaxOutputTokens = allowance

	stream, err := client.Execute(within(t), signed(d))
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := collect(t, stream)
	if err != nil {
		t.Fatal(err)
	}

	if n := len(msgs); n == 0 || msgs[n-1].GetSummary().GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED ||
		msgs[n-1].GetSummary().GetIterations() != 2 {
		t.Fatalf("stream = %v; want a successful summary after 2 iterations", msgs)
	}
	grants := map[int64]reservation{}
	for _, r := range b.reservations(t) {
		grants[r.ID] = r
	}
	reqs, done := model.requests(), sim.Calls()
	if len(reqs) != 2 || len(done) != 2 || len(grants) != 2 {
		t.Fatalf("%d requests, %d calls, %d reservations; want 2 each", len(reqs), len(done), len(grants))
	}
	var est llm.Estimator
	for i, req := range reqs {
		input := est.Bound(req.Messages, req.Tools...)
		if len(req.Tools) > 0 { // the bound covers the call wound down too: no tools, WindDownMessage
			input = max(input, est.Bound(append(req.Messages[:len(req.Messages):len(req.Messages)], subagent.WindDownMessage)))
		}
		g, ok := grants[req.Meta.ReservationID]
		switch {
		case !ok:
			t.Fatalf("call %d names reservation %d, not one of the task's", i+1, req.Meta.ReservationID)
		case req.InputBound != input:
			t.Errorf("call %d: input bound %d, want %d (llm.Estimator over its request)", i+1, req.InputBound, input)
		case g.Amount >= input+allowance || g.Amount < minReservation:
			t.Fatalf("call %d: granted %d of %d+%d asked, min %d: not a partial grant, the test does not test it",
				i+1, g.Amount, input, allowance, minReservation)
		}
		if want := min(g.Amount-input, allowance); int64(req.MaxTokens) != want || want < 1 {
			t.Errorf("call %d: max_tokens %d under a grant of %d for an input bound of %d; want min(%d - %d, %d) = %d",
				i+1, req.MaxTokens, g.Amount, input, g.Amount, input, allowance, want)
		}
		if u := done[i].Usage; u.Total() > g.Amount || g.Overrun != 0 {
			t.Errorf("call %d: usage %+v over its grant %+v", i+1, u, g)
		}
		est.Record(len(req.Messages), done[i].Usage)
	}
	b.checkLedger(t)
}

// TestDispatchNamesItsOutputAllowance: a worker's loop is built once, with
// the worker's --max-output-tokens, yet each call is made (and reserved)
// with the output allowance its dispatch asks for; a dispatch that asks
// for none gets the worker's.
func TestDispatchNamesItsOutputAllowance(t *testing.T) {
	t.Parallel()
	b := setup(t, 1_000_000, 50, map[string]int64{"a": 50_000, "b": 50_000})
	m := &scripted{}
	client := serve(t, workerServer(t, b, m, nil, nil))
	for _, tc := range []struct {
		task  string
		asked int32
		want  int
	}{
		{"a", 300, 300},
		{"b", 0, subagent.DefaultServerConfig().MaxOutputTokens},
	} {
		d := request(b, tc.task)
		d.Model.MaxOutputTokens = tc.asked
		stream, err := client.Execute(within(t), signed(d))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := collect(t, stream); err != nil {
			t.Fatal(err)
		}
		m.mu.Lock()
		req := m.reqs[len(m.reqs)-1]
		m.mu.Unlock()
		if req.Meta.TaskID != tc.task || req.MaxTokens != tc.want {
			t.Errorf("task %s asked for %d output tokens: its call (task %s) has max_tokens %d, want %d",
				tc.task, tc.asked, req.Meta.TaskID, req.MaxTokens, tc.want)
		}
	}
}
