package orchestrator_test

import (
	"context"
	"errors"
	"io"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent/llm"
)

// Hedged tasks (docs/budget.md#hedged-tasks): these tests run them on real
// workers whose sim models are fast or slow, so that the task that lands
// on the slow one is the straggler.

// hedgeOf returns the TaskHedged events of evs, by task id, and the
// TaskFinished outcomes by task id.
func hedgeEvents(evs []*fanoutv1.RunEvent) (map[string]*fanoutv1.TaskHedged, map[string]*fanoutv1.TaskOutcome) {
	hedged := map[string]*fanoutv1.TaskHedged{}
	finished := map[string]*fanoutv1.TaskOutcome{}
	for _, ev := range evs {
		if h := ev.GetTaskHedged(); h != nil {
			hedged[h.GetTaskId()] = h
		}
		if o := ev.GetTaskFinished().GetOutcome(); o != nil {
			finished[o.GetTaskId()] = o
		}
	}
	return hedged, finished
}

// taskAccountSpent is what the ledger says the task account named taskID
// (a task's, or a hedge's: "_hedge:" + its task id) of run runID spent,
// and whether it has one.
func (b *testBundle) taskAccountSpent(t *testing.T, runID, taskID string) (int64, bool) {
	t.Helper()
	var spent int64
	err := b.pool.QueryRow(t.Context(), `SELECT spent FROM account WHERE run_id = $1 AND kind = 'task' AND task_id = $2`,
		runID, taskID).Scan(&spent)
	if err != nil && strings.Contains(err.Error(), "no rows") {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return spent, true
}

// checkHedgeBilled checks that a hedged task's outcome bills both of its
// attempts exactly: each attempt's figure is what its account spent in the
// ledger, and the task's spend is their sum.
func (b *testBundle) checkHedgeBilled(t *testing.T, runID string, o *fanoutv1.TaskOutcome) {
	t.Helper()
	h := o.GetHedge()
	first, _ := b.taskAccountSpent(t, runID, o.GetTaskId())
	second, ok := b.taskAccountSpent(t, runID, "_hedge:"+o.GetTaskId())
	if !ok {
		t.Fatalf("task %s was hedged but the ledger has no hedge account for it", o.GetTaskId())
	}
	if h.GetFirstTokens() != first || h.GetHedgeTokens() != second {
		t.Errorf("task %s: the outcome bills first %d + hedge %d tokens; the ledger's accounts spent %d + %d",
			o.GetTaskId(), h.GetFirstTokens(), h.GetHedgeTokens(), first, second)
	}
	if o.GetTokensSpent() != first+second {
		t.Errorf("task %s: tokens_spent %d, want both attempts' %d + %d = %d", o.GetTaskId(), o.GetTokensSpent(), first, second, first+second)
	}
}

// TestAStragglerIsHedgedAndTheHedgeWins: of four tasks on four workers,
// the one on the slow worker runs far past its three peers; its hedge
// (latency factor 3, the default) starts on another worker once it has
// run 3 × their median, answers, and wins; the first attempt is
// cancelled, and both attempts' spend, settled in the ledger, is the
// task's.
func TestAStragglerIsHedgedAndTheHedgeWins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f1, _ := b.worker(t, "f1", llm.SimConfig{}, 8)
	f2, _ := b.worker(t, "f2", llm.SimConfig{}, 8)
	f3, _ := b.worker(t, "f3", llm.SimConfig{}, 8)
	slow, slowSim := b.worker(t, "slow", llm.SimConfig{Latency: 20 * time.Second}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, f1, f2, f3, slow)
	s := spec("hedge-wins", 4, 1_000_000) // round-robin: t03 on the slow worker
	s.Tasks[3].Hedge = &fanoutv1.Hedge{MinPeers: 3}
	evs := runStream(t, n.client, s)
	fin := checkEvents(t, evs)
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("run ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	hedged, finished := hedgeEvents(evs)
	h := hedged["t03"]
	if len(hedged) != 1 || h == nil {
		t.Fatalf("hedged tasks %v, want t03 alone", hedged)
	}
	if h.GetWorker() == slow {
		t.Errorf("the hedge was sent to the slow worker %s, which runs the first attempt", slow)
	}
	if !strings.Contains(h.GetReason(), "3 × the median") {
		t.Errorf("hedge reason %q, want the latency factor's", h.GetReason())
	}
	checkHedgeThreshold(t, h)
	o := finished["t03"]
	if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED || o.GetHedge().GetWinner() != fanoutv1.HedgeAttempt_HEDGE_ATTEMPT_HEDGE {
		t.Fatalf("t03 ended %s, hedge %v: want SUCCEEDED with the hedge the winner", o.GetStatus(), o.GetHedge())
	}
	if o.GetWorker() == "slow" || o.GetHedge().GetHedgeWorker() != o.GetWorker() {
		t.Errorf("t03's outcome names worker %s (hedge worker %s), want the hedge's, not the slow one", o.GetWorker(), o.GetHedge().GetHedgeWorker())
	}
	// The first attempt was cancelled, not left to run on.
	for _, c := range slowSim.Calls() {
		if c.TaskID == "t03" && !c.Cancelled {
			t.Errorf("the first attempt's call %+v on the slow worker was not cancelled", c)
		}
	}
	t.Logf("t03: %s; hedge %v", hedgeText(h), o.GetHedge())
	if o.GetHedge().GetFirstTokens() == 0 {
		t.Errorf("the first attempt spent nothing before it was cancelled: this test cannot tell whether it is billed")
	}
	b.checkHedgeBilled(t, evs[0].GetRunId(), o)
	for id, o := range finished {
		if id != "t03" && o.GetHedge() != nil {
			t.Errorf("task %s, without a hedge, reports one: %v", id, o.GetHedge())
		}
	}
	// A hedged task's spend is its two attempts': it is not a whole task
	// of the tenant's prior (docs/budget.md#priors), which has the other
	// three alone.
	tasks, spent, _, err := store.NewRuns(b.pool).TaskPrior(t.Context(), "t1", s.GetModel().GetModel())
	if err != nil {
		t.Fatal(err)
	}
	var others int64
	for id, o := range finished {
		if id != "t03" {
			others += o.GetTokensSpent()
		}
	}
	if tasks != 3 || spent != others {
		t.Errorf("the tenant's prior has %d tasks that spent %d, want t03's three peers' %d", tasks, spent, others)
	}
	b.checkLedger(t)
	b.checkRunJournal(t, evs[0].GetRunId())
}

func hedgeText(h *fanoutv1.TaskHedged) string {
	return "hedged after " + h.GetAfter().AsDuration().String() + " past " + h.GetThreshold().AsDuration().String() + " (" + h.GetReason() + ")"
}

// checkHedgeThreshold checks that a hedge started no earlier than its
// threshold said.
func checkHedgeThreshold(t *testing.T, h *fanoutv1.TaskHedged) {
	t.Helper()
	if h.GetThreshold().AsDuration() <= 0 || h.GetAfter().AsDuration() < h.GetThreshold().AsDuration() {
		t.Errorf("task %s was hedged after %s, before its threshold %s (%s)", h.GetTaskId(), h.GetAfter().AsDuration(),
			h.GetThreshold().AsDuration(), h.GetReason())
	}
}

// TestOnlyTasksWithAHedgeAreHedged: two tasks land on the slow worker;
// the one without a hedge runs to its end there, never hedged, and the one
// with hedge.after is hedged, no earlier than after.
func TestOnlyTasksWithAHedgeAreHedged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fast, _ := b.worker(t, "fast", llm.SimConfig{}, 8)
	slow, _ := b.worker(t, "slow", llm.SimConfig{Latency: 1500 * time.Millisecond}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, fast, slow)
	s := spec("hedge-only-asked", 4, 1_000_000) // round-robin: t01, t03 on the slow worker
	const after = 400 * time.Millisecond
	s.Tasks[3].Hedge = &fanoutv1.Hedge{After: durationpb.New(after)}
	evs := runStream(t, n.client, s)
	fin := checkEvents(t, evs)
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("run ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	hedged, finished := hedgeEvents(evs)
	if h := hedged["t01"]; h != nil || finished["t01"].GetHedge() != nil {
		t.Errorf("t01, without a hedge, was hedged: %v, %v", h, finished["t01"].GetHedge())
	}
	if o := finished["t01"]; o.GetWorker() != "slow" || o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
		t.Errorf("t01 ended %s on %s, want SUCCEEDED on the slow worker", o.GetStatus(), o.GetWorker())
	}
	h := hedged["t03"]
	if h == nil {
		t.Fatalf("t03 (hedge after %s, on the slow worker) was not hedged", after)
	}
	if h.GetThreshold().AsDuration() != after || h.GetReason() != "after "+after.String() {
		t.Errorf("t03's threshold %s (%q), want its after %s", h.GetThreshold().AsDuration(), h.GetReason(), after)
	}
	checkHedgeThreshold(t, h)
	if h.GetWorker() != fast {
		t.Errorf("t03's hedge went to %s, want the other worker %s", h.GetWorker(), fast)
	}
	o := finished["t03"]
	if o.GetHedge().GetWinner() != fanoutv1.HedgeAttempt_HEDGE_ATTEMPT_HEDGE || o.GetHedge().GetStartedAfter().AsDuration() < after {
		t.Errorf("t03's hedge report %v: want the hedge the winner, started no earlier than %s", o.GetHedge(), after)
	}
	b.checkHedgeBilled(t, evs[0].GetRunId(), o)
	b.checkLedger(t)
}

// TestCancelMidHedgeStopsBothAttempts: a run cancelled while a task's two
// attempts both run stops both: the task ends CANCELLED, no attempt won,
// both workers' calls were cancelled, and what both spent is the task's.
func TestCancelMidHedgeStopsBothAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w1, sim1 := b.worker(t, "slow1", llm.SimConfig{Latency: 30 * time.Second}, 8)
	w2, sim2 := b.worker(t, "slow2", llm.SimConfig{Latency: 30 * time.Second}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w1, w2)
	s := spec("hedge-cancel", 1, 1_000_000)
	s.Tasks[0].Hedge = &fanoutv1.Hedge{After: durationpb.New(200 * time.Millisecond)}
	start, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := start.GetRunId()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	stream, err := n.client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	var evs []*fanoutv1.RunEvent
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, msg.GetEvent())
		if msg.GetEvent().GetTaskHedged() != nil {
			// Both attempts run: the hedge's call has begun on its worker.
			deadline := time.Now().Add(patience)
			for len(sim1.Calls())+len(sim2.Calls()) < 2 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond) // polling the sims' call logs, bounded by patience
			}
			if _, err := n.client.CancelRun(t.Context(), &fanoutv1.CancelRunRequest{RunId: runID, Reason: "stop"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	fin := checkEvents(t, evs)
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_CANCELLED {
		t.Fatalf("run ended %s (%q), want CANCELLED", fin.GetState(), fin.GetCancelCause())
	}
	hedged, finished := hedgeEvents(evs)
	if hedged["t00"] == nil {
		t.Fatal("t00 was not hedged")
	}
	o := finished["t00"]
	if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_CANCELLED || o.GetHedge() == nil ||
		o.GetHedge().GetWinner() != fanoutv1.HedgeAttempt_HEDGE_ATTEMPT_UNSPECIFIED {
		t.Errorf("t00 ended %s with hedge report %v: want CANCELLED, neither attempt the winner", o.GetStatus(), o.GetHedge())
	}
	calls := append(sim1.Calls(), sim2.Calls()...)
	if len(calls) != 2 {
		t.Errorf("%d model calls, want the two attempts' first calls", len(calls))
	}
	for _, c := range calls {
		if !c.Cancelled {
			t.Errorf("call %+v ran on after the run was cancelled", c)
		}
	}
	b.checkHedgeBilled(t, runID, o)
	b.checkLedger(t)
}

// TestHedgeValidation: a hedge's limits, each violation naming its field
// and its limit; a task that may write cannot be hedged.
func TestHedgeValidation(t *testing.T) {
	t.Parallel()
	cfg := orchestrator.Config{KnownTools: []string{"search", "fetch", "note"}, ReadTools: []string{"search", "fetch"}}
	cases := []struct {
		name  string
		hedge *fanoutv1.Hedge
		tools []string
		field string
		says  string // part of the reason
	}{
		{"factor below 1.5", &fanoutv1.Hedge{LatencyFactor: 1.2}, nil, "spec.tasks[1].hedge.latency_factor", "1.5..100, got 1.2"},
		{"factor over 100", &fanoutv1.Hedge{LatencyFactor: 101}, nil, "spec.tasks[1].hedge.latency_factor", "1.5..100"},
		{"factor NaN", &fanoutv1.Hedge{LatencyFactor: math.NaN()}, nil, "spec.tasks[1].hedge.latency_factor", "got NaN"},
		{"negative peers", &fanoutv1.Hedge{MinPeers: -1}, nil, "spec.tasks[1].hedge.min_peers", "got -1"},
		{"more peers than the run has", &fanoutv1.Hedge{MinPeers: 4}, nil, "spec.tasks[1].hedge.min_peers", "the run's other tasks (3), got 4"},
		{"after too short", &fanoutv1.Hedge{After: durationpb.New(time.Millisecond)}, nil, "spec.tasks[1].hedge.after", "at least 100ms"},
		{"after past the timeout", &fanoutv1.Hedge{After: durationpb.New(time.Hour)}, nil, "spec.tasks[1].hedge.after", "less than the task's timeout 10m0s"},
		{"a write tool", &fanoutv1.Hedge{}, []string{"search", "note"}, "spec.tasks[1].hedge", `tool "note" (allowed_tools[1]), which may write`},
	}
	for _, tc := range cases {
		s := spec("v", 4, 1_000_000)
		s.Tasks[1].Hedge, s.Tasks[1].AllowedTools = tc.hedge, tc.tools
		s.Tasks[1].Timeout = durationpb.New(10 * time.Minute)
		err := cfg.Validate(s)
		var ve budget.ValidationErrors
		if !errors.As(err, &ve) || len(ve) != 1 || ve[0].Field != tc.field || !strings.Contains(ve[0].Reason, tc.says) {
			t.Errorf("%s: %v; want one violation of %s saying %q", tc.name, err, tc.field, tc.says)
		}
	}
	// The default min_peers (3) needs 3 other tasks, unless after is set.
	s := spec("v", 3, 1_000_000)
	s.Tasks[0].Hedge = &fanoutv1.Hedge{}
	var ve budget.ValidationErrors
	if err := cfg.Validate(s); !errors.As(err, &ve) || ve[0].Field != "spec.tasks[0].hedge" {
		t.Errorf("a default hedge in a run of 3 tasks: %v; want a violation of spec.tasks[0].hedge", err)
	}
	s.Tasks[0].Hedge = &fanoutv1.Hedge{After: durationpb.New(time.Second)}
	if err := cfg.Validate(s); err != nil {
		t.Errorf("a hedge after 1s in a run of 3 tasks: %v", err)
	}
	ok := spec("v", 4, 1_000_000)
	ok.Tasks[1].Hedge, ok.Tasks[1].AllowedTools = &fanoutv1.Hedge{LatencyFactor: 2, MinPeers: 3}, []string{"search", "fetch"}
	if err := cfg.Validate(ok); err != nil {
		t.Errorf("a read-only task's hedge: %v", err)
	}
}

// BenchmarkHedgedStraggler measures one run of 8 tasks on 4 workers, one
// of which is slow (1s a model call, two calls a task), with and without a
// hedge on every task (latency factor 3, 3 peers): the run's time (its
// RunStarted to its RunFinished, database time) and its tokens, per run.
//
//	go test -run '^$' -bench HedgedStraggler -benchtime 3x ./orchestrator/
func BenchmarkHedgedStraggler(b *testing.B) {
	for _, hedged := range []bool{false, true} {
		name := "none"
		if hedged {
			name = "hedge"
		}
		b.Run(name, func(b *testing.B) {
			tb := setup(b)
			var workers []string
			for k := range 3 {
				w, _ := tb.worker(b, "fast"+string(rune('1'+k)), llm.SimConfig{}, 8)
				workers = append(workers, w)
			}
			slow, _ := tb.worker(b, "slow", llm.SimConfig{Latency: time.Second}, 8)
			n := tb.orchestrator(b, "o1", orchestrator.Config{}, append(workers, slow)...)
			var secs, tokens float64
			for i := 0; b.Loop(); i++ {
				s := spec(name+string(rune('a'+i%26))+time.Now().Format("150405.000000"), 8, 1_000_000)
				if hedged {
					for _, t := range s.Tasks {
						t.Hedge = &fanoutv1.Hedge{MinPeers: 3}
					}
				}
				start, err := n.client.StartRun(b.Context(), &fanoutv1.StartRunRequest{Spec: s})
				if err != nil {
					b.Fatal(err)
				}
				evs := watchAll(b, n.client, start.GetRunId())
				fin := evs[len(evs)-1]
				secs += fin.GetTime().AsTime().Sub(evs[0].GetTime().AsTime()).Seconds()
				tokens += float64(fin.GetRunFinished().GetResult().GetTotalTokens())
			}
			b.ReportMetric(secs/float64(b.N), "run-s/op")
			b.ReportMetric(tokens/float64(b.N), "tokens/op")
		})
	}
}

// TestAJoinPolicyStopsBothAttemptsOfAHedge: a FIRST_SUCCESS run whose
// other task answers while a hedged task's two attempts both run on slow
// workers cuts both at once. The workers do not hear that cause by
// themselves (the run's account is ended only after its tasks), so only
// the task's context stops them: the hedge must run under it.
func TestAJoinPolicyStopsBothAttemptsOfAHedge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mid, _ := b.worker(t, "mid", llm.SimConfig{Latency: 800 * time.Millisecond}, 8)
	w1, sim1 := b.worker(t, "slow1", llm.SimConfig{Latency: 30 * time.Second}, 8)
	w2, sim2 := b.worker(t, "slow2", llm.SimConfig{Latency: 30 * time.Second}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, mid, w1, w2)
	s := spec("hedge-join", 2, 1_000_000) // round-robin: t00 on mid, t01 on slow1, its hedge on slow2
	s.JoinPolicy = fanoutv1.JoinPolicy_JOIN_POLICY_FIRST_SUCCESS
	s.Tasks[1].Hedge = &fanoutv1.Hedge{After: durationpb.New(200 * time.Millisecond)}
	evs := runStream(t, n.client, s)
	fin := checkEvents(t, evs)
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("run ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	hedged, finished := hedgeEvents(evs)
	if hedged["t01"] == nil {
		t.Fatal("t01 was not hedged")
	}
	if o := finished["t00"]; o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED || o.GetWorker() != "mid" {
		t.Fatalf("t00 ended %s on %s, want SUCCEEDED on mid (the test's schedule did not happen)", o.GetStatus(), o.GetWorker())
	}
	o := finished["t01"]
	if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_CANCELLED || o.GetHedge().GetWinner() != fanoutv1.HedgeAttempt_HEDGE_ATTEMPT_UNSPECIFIED {
		t.Errorf("t01 ended %s with hedge report %v: want CANCELLED, neither attempt the winner", o.GetStatus(), o.GetHedge())
	}
	calls := append(sim1.Calls(), sim2.Calls()...)
	if len(calls) != 2 {
		t.Errorf("%d model calls on the slow workers, want t01's two attempts' first calls", len(calls))
	}
	for _, c := range calls {
		if !c.Cancelled {
			t.Errorf("call %+v ran on after the run's join policy stopped it", c)
		}
	}
	b.checkHedgeBilled(t, evs[0].GetRunId(), o)
	b.checkLedger(t)
}

// TestAdoptionFencesAndBillsALostHedge: the lost orchestrator had hedged
// t01, and its hedge had spent 40 tokens on its own account. The adopter
// fences that hedge with the task (a new attempt on the hedge's account:
// the lost hedge's next reserve is denied), resumes t01 as one task with
// one outcome, and bills it what both its accounts spent. (The fence is
// read from the hedge's account after the run: a reserve made to probe it
// while the run goes would, if it were granted, hold the adopter up.)
func TestAdoptionFencesAndBillsALostHedge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := spec("hedge-adopt", 2, 100_000)
	s.Tasks[1].Hedge = &fanoutv1.Hedge{After: durationpb.New(time.Minute)}
	const runID = "hedge-adopt-run"
	accts := ghost(t, b, runID, s)
	ctx := t.Context()
	if _, err := store.NewRuns(b.pool).StartTask(ctx, runID, "ghost", &fanoutv1.TaskStarted{TaskId: "t01", Worker: "old-worker"}); err != nil {
		t.Fatal(err)
	}
	hedgeAcct, err := b.ledger.OpenHedge(ctx, accts.Tasks["t01"], runID, "t1", 0)
	if err != nil {
		t.Fatal(err)
	}
	attempt, err := b.ledger.BeginAttempt(ctx, hedgeAcct, runID, "t1")
	if err != nil {
		t.Fatal(err)
	}
	reserve := func() (budget.Reservation, error) {
		return b.ledger.Reserve(ctx, budget.ReserveParams{Account: hedgeAcct, RunID: runID, TenantID: "t1",
			Attempt: attempt.N, Secret: attempt.Secret, Want: 100, Min: 10, Holder: "old-hedge-worker", TTL: time.Hour})
	}
	r, err := reserve()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Settle(ctx, budget.SettleParams{Reservation: r.ID, Generation: r.Lease.Generation,
		Secret: attempt.Secret, Actual: 40}); err != nil {
		t.Fatal(err)
	}
	orphan(t, b, runID)
	w, _ := b.worker(t, "w", resumeSim, 8)
	adopter := b.orchestrator(t, "r", leaseConfig(), w)
	checkResumed(t, b, adopter.client, s, runID, "ghost", "r")
	if _, err := reserve(); !errors.Is(err, budget.ErrDenied) && !errors.Is(err, budget.ErrExhausted) {
		t.Errorf("the lost hedge reserved again after the run was adopted: %v; want it refused", err)
	}
	var fenced int64
	if err := b.pool.QueryRow(ctx, `SELECT attempt FROM account WHERE account_id = $1`, int64(hedgeAcct)).Scan(&fenced); err != nil {
		t.Fatal(err)
	}
	if fenced <= attempt.N {
		t.Errorf("the hedge's account is at attempt %d after the adoption, want past the lost hedge's %d (fenced)", fenced, attempt.N)
	}
	got, err := adopter.client.GetRun(ctx, &fanoutv1.GetRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	task, _ := b.taskAccountSpent(t, runID, "t01")
	for _, o := range got.GetRun().GetTasks() {
		if o.GetTaskId() == "t01" && o.GetTokensSpent() != task+40 {
			t.Errorf("t01 billed %d tokens, want its account's %d + the lost hedge's 40", o.GetTokensSpent(), task)
		}
	}
	b.checkLedger(t)
}

// TestOnlyTheRunsOwnerOpensAHedge: an orchestrator that lost its run (the
// run changed hands since it took it: its epoch is stale) cannot open a
// hedge: the adopter read the run's accounts after the adoption, and a
// hedge opened after it would be neither fenced nor billed by it
// (docs/budget.md#hedged-tasks). The current owner opens it.
func TestOnlyTheRunsOwnerOpensAHedge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := spec("hedge-epoch", 2, 100_000)
	const runID = "hedge-epoch-run"
	accts := ghost(t, b, runID, s)
	ctx := t.Context()
	if _, err := b.pool.Exec(ctx, `UPDATE run SET adoptions = 1 WHERE run_id = $1`, runID); err != nil {
		t.Fatal(err)
	}
	if h, err := b.ledger.OpenHedge(ctx, accts.Tasks["t01"], runID, "t1", 0); !errors.Is(err, budget.ErrDenied) {
		t.Errorf("a hedge opened by the run's owner before its adoption (epoch 0 of 1): account %d, %v; want denied", h, err)
	}
	if _, ok := b.taskAccountSpent(t, runID, "_hedge:t01"); ok {
		t.Error("the refused hedge's account exists")
	}
	if _, err := b.ledger.OpenHedge(ctx, accts.Tasks["t01"], runID, "t1", 1); err != nil {
		t.Errorf("a hedge opened by the run's owner (epoch 1): %v", err)
	}
}

// TestNoHedgeOnceTheFirstAttemptEnded: a first attempt that ends while its
// hedge's account opens is the task's outcome; the hedge is not dispatched
// (no TaskHedged, no call on the second worker, no hedge report). Not
// parallel: the hook (SetHedgeOpened) is the package's.
func TestNoHedgeOnceTheFirstAttemptEnded(t *testing.T) {
	b := setup(t)
	first, _ := b.worker(t, "first", llm.SimConfig{Latency: 300 * time.Millisecond}, 8)
	second, secondSim := b.worker(t, "second", llm.SimConfig{}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, first, second)
	var opened atomic.Bool
	orchestrator.SetHedgeOpened(t, func(firstEnded func() bool) {
		opened.Store(true)
		deadline := time.Now().Add(10 * time.Second)
		for !firstEnded() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // polling the first attempt's end, bounded by deadline
		}
	})
	s := spec("hedge-ended", 1, 1_000_000) // t00 on the first worker
	s.Tasks[0].Hedge = &fanoutv1.Hedge{After: durationpb.New(100 * time.Millisecond)}
	evs := runStream(t, n.client, s)
	fin := checkEvents(t, evs)
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("run ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	if !opened.Load() {
		t.Fatal("no hedge's account was opened: this test cannot tell whether a hedge starts after the first attempt ended")
	}
	hedged, finished := hedgeEvents(evs)
	if len(hedged) != 0 {
		t.Errorf("TaskHedged %v after the first attempt ended", hedged)
	}
	if o := finished["t00"]; o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED || o.GetHedge() != nil || o.GetWorker() != "first" {
		t.Errorf("t00 ended %s on %s, hedge %v: want SUCCEEDED on first, the first attempt's worker, without a hedge", o.GetStatus(), o.GetWorker(), o.GetHedge())
	}
	if calls := secondSim.Calls(); len(calls) != 0 {
		t.Errorf("the hedge's worker got %d calls, want none", len(calls))
	}
	b.checkLedger(t)
}
