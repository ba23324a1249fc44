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

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

func newLoop(b *bundle, m llm.Model) *subagent.Loop {
	return &subagent.Loop{Ledger: b.ledger, Model: m, Holder: "w1", MaxOutputTokens: 200}
}

func newTask(b *bundle, id string) subagent.Task {
	return subagent.Task{
		RunID: b.runID, TenantID: "t1", TaskID: id, Goal: "learn", Instruction: "find facts about " + id,
		Account: b.accts.Tasks[id], MinReservation: 50, AllowedTools: []string{"search", "fetch"},
	}
}

func TestLoopHappyPath(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	sim := newSim(t, llm.SimConfig{ToolCallsPerIteration: 2, FinishAfter: 3, Facts: 3, InputTokens: 100, OutputTokens: 50})
	loop := newLoop(b, sim)
	var progress []subagent.Progress
	loop.ProgressFunc = func(p subagent.Progress) { progress = append(progress, p) }

	sum := loop.Run(t.Context(), newTask(b, "a"))

	if sum.Status != subagent.StatusSucceeded || sum.Err != nil {
		t.Fatalf("status = %s, err = %v", sum.Status, sum.Err)
	}
	if sum.Iterations != 3 || sum.TokensSpent != 3*150 {
		t.Errorf("iterations = %d, tokens = %d; want 3, 450", sum.Iterations, sum.TokensSpent)
	}
	if got := b.account(t, "a").Spent; got != sum.TokensSpent {
		t.Errorf("ledger task account spent %d, summary says %d", got, sum.TokensSpent)
	}
	if len(sum.Facts) != 3 {
		t.Fatalf("facts = %+v, want 3", sum.Facts)
	}
	for _, f := range sum.Facts {
		if len(f.Sources) == 0 || !strings.HasPrefix(f.Sources[0], "https://") {
			t.Errorf("fact %q has sources %v, want a URL from a tool result", f.Text, f.Sources)
		}
	}
	if len(sum.Tried) != 4 || !strings.HasPrefix(sum.Tried[0], "search(") || !strings.HasPrefix(sum.Tried[1], "fetch(") {
		t.Errorf("tried = %q, want search, fetch twice", sum.Tried)
	}
	want := []subagent.Progress{{Iteration: 1, TokensSpent: 150, ToolCalls: 2}, {Iteration: 2, TokensSpent: 300, ToolCalls: 2},
		{Iteration: 3, TokensSpent: 450, ToolCalls: 0, Last: true}} // its answer: no compression call follows
	var got []subagent.Progress
	for _, p := range progress {
		// What each call was granted and the peak (spend before a call
		// plus its grant) are bounds: above the spend, never below.
		if p.Granted <= 150 || p.Peak < p.TokensSpent-150+p.Granted {
			t.Errorf("progress %+v: want a grant above the call's 150 tokens and the peak at least the spend before it plus that grant", p)
		}
		p.Granted, p.Peak = 0, 0
		got = append(got, p)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("progress = %v, want %v", got, want)
	}
	// Each call's log entry names the reservation that paid for it.
	res := b.reservations(t)
	calls := sim.Calls()
	if len(res) != 3 || len(calls) != 3 {
		t.Fatalf("%d reservations, %d calls; want 3 each", len(res), len(calls))
	}
	for i, c := range calls {
		if c.ReservationID != res[i].ID || c.Iteration != i+1 || res[i].State != "settled" || res[i].Estimated {
			t.Errorf("call %+v, reservation %+v", c, res[i])
		}
	}
	b.checkLedger(t)
}

func TestLoopTaskBudgetStopsOneTask(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"small": 800, "big": 50_000}) // a first call reserves ~1,000: every byte of the prompt
	sim := newSim(t, llm.SimConfig{ToolCallsPerIteration: 1, FinishAfter: 5, InputTokens: 100, OutputTokens: 50})
	loop := newLoop(b, sim)

	sums := make(map[string]subagent.Summary)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, id := range []string{"small", "big"} {
		wg.Go(func() {
			s := loop.Run(t.Context(), newTask(b, id))
			mu.Lock()
			sums[id] = s
			mu.Unlock()
		})
	}
	both := make(chan struct{})
	go func() { wg.Wait(); close(both) }()
	await(t, both, "both tasks ending")

	if s := sums["small"]; s.Status != subagent.StatusBudgetExhausted || !errors.Is(s.Err, budget.ErrExhausted) {
		t.Errorf("small: status %s, err %v; want BUDGET_EXHAUSTED", s.Status, s.Err)
	}
	if s := sums["big"]; s.Status != subagent.StatusSucceeded {
		t.Errorf("big: status %s, err %v; want SUCCEEDED", s.Status, s.Err)
	}
	for id, s := range sums {
		if got := b.account(t, id).Spent; got != s.TokensSpent {
			t.Errorf("%s: ledger spent %d, summary %d", id, got, s.TokensSpent)
		}
	}
	if s := sums["small"]; len(s.Tried) == 0 || len(s.Facts) == 0 {
		t.Errorf("small stopped early but lost what it found and tried: %+v", s)
	}
	b.checkLedger(t)
}

func TestLoopIterationLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	sim := newSim(t, llm.SimConfig{ToolCallsPerIteration: 1, FinishAfter: 5})
	task := newTask(b, "a")
	task.MaxIterations = 2

	sum := newLoop(b, sim).Run(t.Context(), task)

	if sum.Status != subagent.StatusIterationLimit || !errors.Is(sum.Err, subagent.ErrIterationLimit) {
		t.Errorf("status %s, err %v; want ITERATION_LIMIT", sum.Status, sum.Err)
	}
	if sum.Iterations != 2 || len(sum.Tried) != 2 || len(sum.Facts) == 0 {
		t.Errorf("summary %+v: want 2 iterations, 2 tool calls and the search results as facts", sum)
	}
	b.checkLedger(t)
}

// TestLoopCancelMidCall cancels an in-flight call: it is settled at its full
// reservation, flagged estimated, and nothing is left held.
func TestLoopCancelMidCall(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		policy subagent.Policy
		signal *budget.RunSignal // fired through the watch, if set
		cause  error             // else the parent context is cancelled with this
		want   subagent.Status
	}{
		{"exhausted under cancel", subagent.PolicyCancel,
			&budget.RunSignal{RunID: "run1", State: budget.StateExhausted}, nil, subagent.StatusBudgetExhausted},
		{"run cancelled under drain", subagent.PolicyDrain,
			&budget.RunSignal{RunID: "run1", State: budget.StateCancelled}, nil, subagent.StatusCancelled},
		{"orchestrator cancelled", subagent.PolicyCancel, nil, budget.ErrRunCancelled, subagent.StatusCancelled},
		{"deadline", subagent.PolicyCancel, nil, context.DeadlineExceeded, subagent.StatusTimedOut},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
			model := newGated(newSim(t, llm.SimConfig{}))
			task := newTask(b, "a")
			task.OnExhaustion = tc.policy
			watch := newWatch()
			task.Watch = watch
			ctx, cancel := context.WithCancelCause(t.Context())
			defer cancel(nil)

			wait := goRun(t, ctx, newLoop(b, model), task)
			waitStarted(t, model)
			if tc.signal != nil {
				watch.fire(*tc.signal)
			} else {
				cancel(tc.cause)
			}
			sum := wait("the loop ending after its in-flight call was cancelled")

			if sum.Status != tc.want {
				t.Errorf("status %s (err %v), want %s", sum.Status, sum.Err, tc.want)
			}
			res := b.reservations(t)
			if len(res) != 1 {
				t.Fatalf("reservations = %+v, want 1", res)
			}
			r := res[0]
			if r.State != "settled" || !r.Estimated || r.Actual == nil || *r.Actual != r.Amount || r.Spent != r.Amount {
				t.Errorf("reservation %+v: want settled, estimated, at its full amount", r)
			}
			if sum.TokensSpent != r.Amount || b.account(t, "a").Spent != r.Amount {
				t.Errorf("summary spent %d, reservation %d", sum.TokensSpent, r.Amount)
			}
			b.checkLedger(t)
		})
	}
}

// TestLoopDrain exhausts the run with the in-flight call's own reservation:
// under DRAIN the call finishes and settles its real usage, and nothing new
// starts.
func TestLoopDrain(t *testing.T) {
	t.Parallel()
	for _, withWatch := range []bool{true, false} {
		t.Run(fmt.Sprintf("watch=%v", withWatch), func(t *testing.T) {
			t.Parallel()
			// Reserving ~1.1k of 2k leaves less than the 1.5k minimum: the run is exhausted.
			b := setup(t, 2000, 1500, map[string]int64{"a": 2000})
			model := newGated(newSim(t, llm.SimConfig{ToolCallsPerIteration: 1, InputTokens: 100, OutputTokens: 50}))
			loop := newLoop(b, model)
			loop.MaxOutputTokens = 1024
			task := newTask(b, "a")
			task.OnExhaustion = subagent.PolicyDrain
			watch := newWatch()
			if withWatch {
				task.Watch = watch
			}

			wait := goRun(t, t.Context(), loop, task)
			waitStarted(t, model)
			if a, err := b.ledger.RunAccount(t.Context(), b.runID); err != nil || a.State != budget.StateExhausted {
				t.Fatalf("run account %+v, %v: want exhausted by the reservation", a, err)
			}
			watch.fire(budget.RunSignal{RunID: b.runID, State: budget.StateExhausted})
			close(model.release)
			sum := wait("the loop ending after its drained call")

			if sum.Status != subagent.StatusBudgetExhausted || sum.Iterations != 1 {
				t.Errorf("status %s after %d iterations (err %v), want BUDGET_EXHAUSTED after 1", sum.Status, sum.Iterations, sum.Err)
			}
			res := b.reservations(t)
			if len(res) != 1 || res[0].State != "settled" || res[0].Estimated || res[0].Spent != 150 {
				t.Errorf("reservations %+v: want one settled with its real usage 150", res)
			}
			if sum.TokensSpent != 150 {
				t.Errorf("tokens spent %d, want 150", sum.TokensSpent)
			}
			b.checkLedger(t)
		})
	}
}

// firingLedger fires a watch right after a reservation is granted, as if the
// run's exhaustion notice arrived between the reserve and the model call.
type firingLedger struct {
	*store.Ledger
	watch *chanWatch
}

func (l firingLedger) Reserve(ctx context.Context, p budget.ReserveParams) (budget.Reservation, error) {
	r, err := l.Ledger.Reserve(ctx, p)
	l.watch.fire(budget.RunSignal{RunID: "run1", State: budget.StateExhausted})
	return r, err
}

// TestLoopNoCallAfterRunEnded checks I6: once the worker knows the run
// ended, no model call starts and nothing stays reserved.
func TestLoopNoCallAfterRunEnded(t *testing.T) {
	t.Parallel()
	t.Run("known before reserving", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
		sim := newSim(t, llm.SimConfig{})
		task := newTask(b, "a")
		watch := newWatch()
		watch.fire(budget.RunSignal{RunID: b.runID, State: budget.StateCancelled})
		task.Watch = watch
		sum := newLoop(b, sim).Run(t.Context(), task)
		if sum.Status != subagent.StatusCancelled || len(sim.Calls()) != 0 || len(b.reservations(t)) != 0 {
			t.Errorf("status %s, %d calls, %d reservations; want CANCELLED, none, none",
				sum.Status, len(sim.Calls()), len(b.reservations(t)))
		}
	})
	t.Run("learned while reserving", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
		sim := newSim(t, llm.SimConfig{})
		task := newTask(b, "a")
		task.OnExhaustion = subagent.PolicyDrain // so only the pre-call check can stop it
		task.Watch = newWatch()
		loop := newLoop(b, sim)
		loop.Ledger = firingLedger{b.ledger, task.Watch.(*chanWatch)}
		sum := loop.Run(t.Context(), task)
		res := b.reservations(t)
		if sum.Status != subagent.StatusBudgetExhausted || len(sim.Calls()) != 0 || len(res) != 1 || res[0].State != "voided" {
			t.Errorf("status %s, %d calls, reservations %+v; want BUDGET_EXHAUSTED, none, one voided",
				sum.Status, len(sim.Calls()), res)
		}
		b.checkLedger(t)
	})
	t.Run("run cancelled in the ledger", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
		if _, err := b.ledger.CancelRun(t.Context(), b.runID, "test"); err != nil {
			t.Fatal(err)
		}
		sim := newSim(t, llm.SimConfig{})
		sum := newLoop(b, sim).Run(t.Context(), newTask(b, "a"))
		if sum.Status != subagent.StatusCancelled || len(sim.Calls()) != 0 {
			t.Errorf("status %s (err %v), %d calls; want CANCELLED, none", sum.Status, sum.Err, len(sim.Calls()))
		}
	})
}

func TestLoopModelFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	sim := newSim(t, llm.SimConfig{ToolCallsPerIteration: 1, FinishAfter: 3, FailEvery: 2, InputTokens: 10, OutputTokens: 10})
	sum := newLoop(b, sim).Run(t.Context(), newTask(b, "a"))
	if sum.Status != subagent.StatusFailed || !errors.Is(sum.Err, llm.ErrSimFailure) {
		t.Errorf("status %s, err %v; want FAILED with the model's error", sum.Status, sum.Err)
	}
	res := b.reservations(t)
	if len(res) != 2 || res[1].State != "settled" || !res[1].Estimated || res[1].Spent != res[1].Amount {
		t.Errorf("reservations %+v: the failed call must be settled estimated at its full amount", res)
	}
	if got := b.account(t, "a").Spent; got != sum.TokensSpent {
		t.Errorf("ledger spent %d, summary %d", got, sum.TokensSpent)
	}
	b.checkLedger(t)
}

// TestLoopLeaseRenewed holds a model call past the end of its
// reservation's first lease, and watches the reservation row: while the
// call runs, the worker renews the lease (lease_expires_at moves on, in
// database time), so past the first lease's end the reservation is still
// held under a live lease; once let through, the call finishes and is
// settled with its real usage, after the first lease would have ended.
func TestLoopLeaseRenewed(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	sim := newSim(t, llm.SimConfig{FinishAfter: 1, InputTokens: 100, OutputTokens: 50})
	model := newGated(sim)
	loop := newLoop(b, model)
	loop.LeaseTTL = 3 * time.Second // renewed every second; generous for a busy machine
	wait := goRun(t, t.Context(), loop, newTask(b, "a"))
	waitStarted(t, model)

	// All in database time: the first lease ended TTL after the grant.
	type lease struct {
		state                    string
		firstEnd, expires, dbNow time.Time
	}
	read := func() lease {
		t.Helper()
		var l lease
		if err := b.pool.QueryRow(t.Context(), `SELECT state, created_at + make_interval(secs => $1), lease_expires_at, now()
			FROM reservation`, loop.LeaseTTL.Seconds()).Scan(&l.state, &l.firstEnd, &l.expires, &l.dbNow); err != nil {
			t.Fatal(err)
		}
		return l
	}
	var l lease
	poll(t, "the reservation's first lease to end (database time)", func() bool {
		l = read()
		return l.state != "held" || !l.dbNow.Before(l.firstEnd)
	})
	if l.state != "held" {
		t.Fatalf("the reservation was %s at %v, before its first lease ended at %v (database time): "+
			"the call did not outlive its first lease", l.state, l.dbNow, l.firstEnd)
	}
	if !l.expires.After(l.firstEnd) || !l.expires.After(l.dbNow) {
		t.Fatalf("at %v (database time), past the first lease's end %v, the lease ends %v: it was not renewed",
			l.dbNow, l.firstEnd, l.expires)
	}
	renewed := l.expires
	poll(t, "the lease to be renewed again while the call runs", func() bool {
		l = read()
		return l.state != "held" || l.expires.After(renewed)
	})
	if l.state != "held" {
		t.Fatalf("the reservation was %s before the call was let through", l.state)
	}

	close(model.release)
	sum := wait("the call finishing once let through")
	if sum.Status != subagent.StatusSucceeded {
		t.Fatalf("status %s, err %v", sum.Status, sum.Err)
	}
	if calls := sim.Calls(); len(calls) != 1 || calls[0].Cancelled {
		t.Errorf("calls %+v, want one, not cancelled", calls)
	}
	res := b.reservations(t)
	if len(res) != 1 || res[0].State != "settled" || res[0].Estimated || res[0].Spent != 150 {
		t.Errorf("reservations %+v: want one settled with its real usage 150", res)
	}
	var outlived bool
	if err := b.pool.QueryRow(t.Context(), `SELECT resolved_at > created_at + make_interval(secs => $1) FROM reservation`,
		loop.LeaseTTL.Seconds()).Scan(&outlived); err != nil {
		t.Fatal(err)
	}
	if !outlived {
		t.Error("the reservation was settled before its first lease ended (database time)")
	}
	b.checkLedger(t)
}

// TestLoopToolResultsInCallOrder makes the first read finish after the
// second: the results still reach the model in call order.
func TestLoopToolResultsInCallOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	fastDone := make(chan struct{})
	tools, err := subagent.NewTools(
		subagent.Tool{Name: "slow", Effect: subagent.EffectRead, Schema: json.RawMessage(`{"type":"object","properties":{"query":{"type":"string"}}}`),
			Func: func(ctx context.Context, _ subagent.ToolCall) (subagent.ToolResult, error) {
				select {
				case <-fastDone:
					return subagent.ToolResult{Text: "slow result"}, nil
				case <-time.After(10 * time.Second):
					return subagent.ToolResult{}, errors.New("reads did not run in parallel")
				}
			}},
		subagent.Tool{Name: "fast", Effect: subagent.EffectRead, Schema: json.RawMessage(`{"type":"object","properties":{"query":{"type":"string"}}}`),
			Func: func(ctx context.Context, _ subagent.ToolCall) (subagent.ToolResult, error) {
				defer close(fastDone)
				return subagent.ToolResult{Text: "fast result"}, nil
			}},
	)
	if err != nil {
		t.Fatal(err)
	}
	model := newGated(newSim(t, llm.SimConfig{ToolCallsPerIteration: 2, FinishAfter: 2}))
	close(model.release)
	loop := newLoop(b, model)
	loop.Tools = tools
	task := newTask(b, "a")
	task.AllowedTools = []string{"slow", "fast"}

	sum := loop.Run(t.Context(), task)

	if sum.Status != subagent.StatusSucceeded {
		t.Fatalf("status %s, err %v", sum.Status, sum.Err)
	}
	reqs := model.requests()
	msgs := reqs[1].Messages
	got := []string{msgs[len(msgs)-2].Content, msgs[len(msgs)-1].Content}
	if got[0] != "slow result" || got[1] != "fast result" {
		t.Errorf("tool results reached the model as %q, want call order slow, fast", got)
	}
	b.checkLedger(t)
}

// TestLoopWritesOneAtATimeWithKeys checks that write tools run alone, each
// with its own idempotency key derived from run, task, attempt, iteration
// and call index.
func TestLoopWritesOneAtATimeWithKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	var running, maxRunning atomic.Int32
	var mu sync.Mutex
	var keys []string
	tools, err := subagent.NewTools(subagent.Tool{Name: "w", Effect: subagent.EffectWrite,
		// text required: the sim fills it per call, so the three writes differ
		// (the same write twice in a task is sent once)
		Schema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`),
		Func: func(ctx context.Context, c subagent.ToolCall) (subagent.ToolResult, error) {
			n := running.Add(1)
			defer running.Add(-1)
			for m := maxRunning.Load(); n > m && !maxRunning.CompareAndSwap(m, n); m = maxRunning.Load() {
			}
			mu.Lock()
			keys = append(keys, c.IdempotencyKey)
			mu.Unlock()
			return subagent.ToolResult{Text: "ok"}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	loop := newLoop(b, newSim(t, llm.SimConfig{ToolCallsPerIteration: 3, FinishAfter: 2}))
	loop.Tools = tools
	task := newTask(b, "a")
	task.AllowedTools = []string{"w"}
	task.Attempt = 2 // the second dispatch of the task, as the ledger records it
	if n, err := b.ledger.BeginAttempt(t.Context(), task.Account, b.runID, "t1"); err != nil || n.N != 2 {
		t.Fatalf("begin attempt 2: %d, %v", n.N, err)
	}

	if sum := loop.Run(t.Context(), task); sum.Status != subagent.StatusSucceeded {
		t.Fatalf("status %s, err %v", sum.Status, sum.Err)
	}
	want := []string{"run1/a/a2/i1/c0", "run1/a/a2/i1/c1", "run1/a/a2/i1/c2"}
	if fmt.Sprint(keys) != fmt.Sprint(want) || maxRunning.Load() != 1 {
		t.Errorf("keys %q with %d at once; want %q one at a time", keys, maxRunning.Load(), want)
	}
}

// hangingRenewLedger is the real ledger, except that a renewal never
// answers: the database is unreachable for it.
type hangingRenewLedger struct{ budget.Ledger }

func (hangingRenewLedger) Renew(ctx context.Context, _ budget.ReservationID, _ int64, _ time.Duration, _ string) (budget.Reservation, error) {
	<-ctx.Done()
	return budget.Reservation{}, ctx.Err()
}

// TestLoopStopsBeforeTheLeaseEndsWhenRenewalHangs: a worker that cannot
// renew its lease (the renewal hangs) stops the call before the lease could
// end, so no call runs on a reservation the sweeper may already count.
func TestLoopStopsBeforeTheLeaseEndsWhenRenewalHangs(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	sim := newSim(t, llm.SimConfig{Latency: 10 * time.Second, FinishAfter: 1})
	loop := newLoop(b, sim)
	loop.Ledger = hangingRenewLedger{b.ledger}
	loop.LeaseTTL = 600 * time.Millisecond
	start := time.Now()
	sum := loop.Run(t.Context(), newTask(b, "a"))
	took := time.Since(start)
	if sum.Status == subagent.StatusSucceeded {
		t.Fatalf("status %s: the call outlived a lease it could not renew", sum.Status)
	}
	calls := sim.Calls()
	if len(calls) != 1 || !calls[0].Cancelled {
		t.Fatalf("calls %+v: want the one call cancelled", calls)
	}
	if ran := calls[0].End.Sub(calls[0].Start); ran >= loop.LeaseTTL {
		t.Errorf("the call ran %v, not stopped before its %v lease could end (whole task %v)", ran, loop.LeaseTTL, took)
	}
	b.checkLedger(t)
}
