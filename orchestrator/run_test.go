package orchestrator_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/llm"
)

// runStream calls Run and collects every event.
func runStream(t *testing.T, c fanoutv1.OrchestratorServiceClient, s *fanoutv1.RunSpec) []*fanoutv1.RunEvent {
	t.Helper()
	return runStreamAs(t, t.Context(), c, s)
}

func checkDispatchOrder(t *testing.T, s *fanoutv1.RunSpec, tasks []*fanoutv1.TaskOutcome) {
	t.Helper()
	if len(tasks) != len(s.GetTasks()) {
		t.Fatalf("%d task outcomes, want %d", len(tasks), len(s.GetTasks()))
	}
	for i, o := range tasks {
		if o.GetTaskId() != s.GetTasks()[i].GetId() || o.GetDispatchIndex() != int32(i) {
			t.Errorf("outcome %d is task %s (index %d), want %s", i, o.GetTaskId(), o.GetDispatchIndex(), s.GetTasks()[i].GetId())
		}
		if !terminal(o.GetStatus()) {
			t.Errorf("task %s ended %s, not terminal", o.GetTaskId(), o.GetStatus())
		}
	}
}

func TestRunSucceedsAndJoins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w1, _ := b.worker(t, "w1", llm.SimConfig{}, 8)
	w2, _ := b.worker(t, "w2", llm.SimConfig{}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w1, w2)

	s := spec("ok", 6, 1_000_000)
	s.Tasks[2].DependsOn = []string{"t00", "t01"}
	s.Tasks[3].DependsOn = []string{"t02"}
	s.Synthesize = true
	s.Labels = map[string]string{"team": "search"}
	evs := runStream(t, n.client, s)
	fin := checkEvents(t, evs)
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED || fin.GetCancelCause() != "" {
		t.Fatalf("run ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	res := fin.GetResult()
	checkDispatchOrder(t, s, res.GetTasks())
	var total int64
	for _, o := range res.GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			t.Errorf("task %s ended %s: %s", o.GetTaskId(), o.GetStatus(), o.GetSummary().GetError())
		}
		if o.GetStartedAt() == nil || o.GetFinishedAt() == nil || o.GetWorker() == "" {
			t.Errorf("task %s: started %v finished %v worker %q", o.GetTaskId(), o.GetStartedAt(), o.GetFinishedAt(), o.GetWorker())
		}
		total += o.GetTokensSpent()
	}
	// The synthesis call is paid from the run account too: the total is
	// what the tasks spent plus what it spent, which is the run's spend.
	acct, err := b.ledger.RunAccount(t.Context(), evs[0].GetRunId())
	if err != nil {
		t.Fatal(err)
	}
	spent := acct.Spent
	if total == 0 || res.GetTotalTokens() <= total || res.GetTotalTokens() != spent {
		t.Errorf("total tokens %d; tasks add up to %d, the run spent %d (tasks + synthesis)", res.GetTotalTokens(), total, spent)
	}
	if len(res.GetFacts()) == 0 || res.GetSynthesis() == "" || res.GetSynthesisSkippedReason() != "" {
		t.Errorf("facts %d, synthesis %q, skipped reason %q", len(res.GetFacts()), res.GetSynthesis(), res.GetSynthesisSkippedReason())
	}
	// Facts are in dispatch order: the first fact comes from the first task.
	if !strings.Contains(res.GetFacts()[0].GetText(), "t00") {
		t.Errorf("first fact %q is not from t00", res.GetFacts()[0].GetText())
	}
	// t02 started only after t00 and t01 ended.
	finished := map[string]int64{}
	t02Started := false
	for _, ev := range evs {
		if f := ev.GetTaskFinished(); f != nil {
			finished[f.GetOutcome().GetTaskId()] = ev.GetSequence()
		}
		if st := ev.GetTaskStarted(); st != nil && st.GetTaskId() == "t02" {
			t02Started = true
			if finished["t00"] == 0 || finished["t01"] == 0 {
				t.Errorf("t02 started at event %d before its dependencies ended", ev.GetSequence())
			}
		}
	}
	if !t02Started {
		t.Error("no TaskStarted event for t02: its start cannot be shown to follow its dependencies")
	}

	runID := evs[0].GetRunId()
	got, err := n.client.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	r := got.GetRun()
	if r.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED || r.GetFinishedAt() == nil ||
		r.GetLabels()["team"] != "search" || r.GetBudget().GetSpentTokens() != res.GetTotalTokens() || r.GetResult() == nil {
		t.Errorf("GetRun: %v", r)
	}
	checkDispatchOrder(t, s, r.GetTasks())
	b.checkLedger(t)

	// Another tenant does not see it.
	if _, err := n.client.GetRun(tenantCtx(t, "other"), &fanoutv1.GetRunRequest{RunId: runID}); status.Code(err) != codes.NotFound {
		t.Errorf("GetRun as another tenant: %v, want NOT_FOUND", err)
	}
	if _, err := n.client.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetRun of unknown run: %v, want NOT_FOUND", err)
	}
	// Watching an ended run replays the rest of its history and closes.
	tail := watchAllAfter(t, n.client, runID, int64(len(evs)-2))
	if len(tail) != 2 || tail[1].GetRunFinished() == nil {
		t.Errorf("watch after %d: %d events", len(evs)-2, len(tail))
	}
}

func TestIdempotentStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w1", llm.SimConfig{}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w)
	s := spec("same-key", 3, 100_000)
	r1, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	if r1.GetRunId() != r2.GetRunId() {
		t.Errorf("same key gave runs %s and %s", r1.GetRunId(), r2.GetRunId())
	}
	// A Run call with the same key joins the run and sees its whole history.
	evs := runStream(t, n.client, s)
	if evs[0].GetRunId() != r1.GetRunId() {
		t.Errorf("Run joined %s, want %s", evs[0].GetRunId(), r1.GetRunId())
	}
	checkEvents(t, evs)
	var accounts, runs int
	if err := b.pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM account WHERE kind <> 'tenant'),
		(SELECT count(*) FROM run)`).Scan(&accounts, &runs); err != nil {
		t.Fatal(err)
	}
	if accounts != 4 || runs != 1 {
		t.Errorf("%d accounts and %d runs, want 4 (run + 3 tasks) and 1", accounts, runs)
	}
	s2 := spec("same-key", 3, 200_000)
	if _, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s2}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("same key, other spec: %v, want FAILED_PRECONDITION", err)
	}
	b.checkLedger(t)
}

// TestBudgetExhaustedMidRun gives 30 tasks a run budget that pays for
// about half of them: the first finish, then the budget runs out with
// tasks in flight and queued, which end BUDGET_EXHAUSTED. The run's journal
// never has more reserved and spent than the limit, at any point.
func TestBudgetExhaustedMidRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sim := llm.SimConfig{Latency: 20 * time.Millisecond, FinishAfter: 3, ToolCallsPerIteration: 1}
	w1, _ := b.worker(t, "w1", sim, 64)
	w2, _ := b.worker(t, "w2", sim, 64)
	w3, _ := b.worker(t, "w3", sim, 64)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w1, w2, w3)

	// A task spends about 800 tokens in its three calls and reserves at
	// most about 500 at a time. When the run is exhausted, the six in
	// flight hold and have spent at most about 6 x 1000: the rest, several
	// tasks' worth, was spent by tasks that finished. All 30 would need
	// about 24k.
	s := spec("exhaust", 30, 12_000)
	s.Budget.MinReservationTokens = 100
	// Greedy: this test proves that the budget cuts off what runs when it
	// runs out (I6); by forecast, nothing would be running then.
	s.Budget.Admission = fanoutv1.AdmissionPolicy_ADMISSION_POLICY_GREEDY
	s.Limits = &fanoutv1.Limits{MaxConcurrency: 6}
	s.Synthesize = true // and paid from what the run held back for it from the start
	for _, task := range s.Tasks {
		task.AllowedTools = []string{"search"}
	}
	evs := runStream(t, n.client, s)
	fin := checkEvents(t, evs)
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED {
		t.Fatalf("run ended %s (%q), want BUDGET_EXHAUSTED", fin.GetState(), fin.GetCancelCause())
	}
	runID := evs[0].GetRunId()
	checkDispatchOrder(t, s, fin.GetResult().GetTasks())
	// I19: the run that met its budget still ends with an answer, paid from
	// what it held back, which no task could spend.
	if res := fin.GetResult(); res.GetSynthesis() == "" || res.GetSynthesisSkippedReason() != "" {
		t.Errorf("synthesis %q, skipped reason %q; want a synthesis paid from what the run held back",
			res.GetSynthesis(), res.GetSynthesisSkippedReason())
	}
	var held, synthesis, tasksSpent, limit int64
	if err := b.pool.QueryRow(t.Context(), `SELECT held_tokens, synthesis_tokens, limit_tokens,
			(SELECT coalesce(sum(spent), 0) FROM account WHERE run_id = $1 AND kind = 'task')
		FROM run_spend WHERE run_id = $1`, runID).Scan(&held, &synthesis, &limit, &tasksSpent); err != nil {
		t.Fatal(err)
	}
	if synthesis <= 0 || held != 0 {
		t.Errorf("run_spend: synthesis spent %d, still held %d; want the synthesis paid and the rest released", synthesis, held)
	}
	var opened int64
	if err := b.pool.QueryRow(t.Context(), `SELECT coalesce(sum(delta_held), 0) FROM ledger_entry
		WHERE run_id = $1 AND kind = 'hold'`, runID).Scan(&opened); err != nil {
		t.Fatal(err)
	}
	if opened <= 0 || tasksSpent > limit-opened {
		t.Errorf("the run held %d of %d; its tasks spent %d: want something held and the tasks within the rest", opened, limit, tasksSpent)
	}
	counts := map[fanoutv1.TaskStatus]int{}
	var succeeded []string
	for _, o := range fin.GetResult().GetTasks() {
		counts[o.GetStatus()]++
		if o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			succeeded = append(succeeded, o.GetTaskId())
		}
	}
	if counts[fanoutv1.TaskStatus_TASK_STATUS_BUDGET_EXHAUSTED] == 0 || len(succeeded) == 0 ||
		counts[fanoutv1.TaskStatus_TASK_STATUS_BUDGET_EXHAUSTED]+counts[fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED]+
			len(succeeded) != len(s.GetTasks()) {
		t.Errorf("tasks ended %v; want some SUCCEEDED, some BUDGET_EXHAUSTED (cut off) and the rest NOT_STARTED", counts)
	}
	exhaustedSeen := false
	for _, ev := range evs {
		if ev.GetBudgetExhausted() != nil {
			exhaustedSeen = true
		}
	}
	if !exhaustedSeen {
		t.Error("no BudgetExhausted event")
	}
	// In the journal's one sequence: some task that succeeded had settled
	// its last call before the entry that exhausted the run.
	var exhaustedAt int64
	var before []string
	if err := b.pool.QueryRow(t.Context(), `
		WITH x AS (SELECT min(entry_id) AS at FROM ledger_entry WHERE run_id = $1 AND kind = 'exhaust')
		SELECT coalesce(x.at, 0), coalesce((SELECT array_agg(task_id ORDER BY task_id) FROM (
			SELECT task_id FROM ledger_entry WHERE run_id = $1 AND kind = 'settle' AND task_id = ANY ($2)
			 GROUP BY task_id HAVING max(entry_id) < x.at) done), '{}')
		  FROM x`, runID, succeeded).Scan(&exhaustedAt, &before); err != nil {
		t.Fatal(err)
	}
	if exhaustedAt == 0 {
		t.Fatal("the journal has no exhaust entry for the run")
	}
	if len(before) == 0 {
		t.Errorf("of the tasks that succeeded (%v), none had settled its last call before the run was exhausted (entry %d)",
			succeeded, exhaustedAt)
	}
	b.checkRunJournal(t, runID)
	b.checkLedger(t)
}

func TestFailFastCancelsTheRest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "slow", llm.SimConfig{Latency: 30 * time.Second}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w)
	s := spec("ff", 4, 100_000)
	s.JoinPolicy = fanoutv1.JoinPolicy_JOIN_POLICY_FAIL_FAST
	s.Budget.MinReservationTokens = 100
	s.Tasks[2].TokenBudget = 10 // below the minimum reservation: ends at once
	start := time.Now()
	fin := checkEvents(t, runStream(t, n.client, s))
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_FAILED || !strings.Contains(fin.GetCancelCause(), "task t02") {
		t.Fatalf("run ended %s (%q), want FAILED naming t02", fin.GetState(), fin.GetCancelCause())
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("run took %s: the rest was not cancelled", d)
	}
	checkDispatchOrder(t, s, fin.GetResult().GetTasks())
	for _, o := range fin.GetResult().GetTasks() {
		want := fanoutv1.TaskStatus_TASK_STATUS_CANCELLED
		if o.GetTaskId() == "t02" {
			want = fanoutv1.TaskStatus_TASK_STATUS_BUDGET_EXHAUSTED
		}
		if o.GetStatus() != want {
			t.Errorf("task %s ended %s, want %s", o.GetTaskId(), o.GetStatus(), want)
		}
	}
	b.checkLedger(t)
}

func TestFirstSuccessCancelsTheRest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fast, _ := b.worker(t, "fast", llm.SimConfig{}, 8)
	slow, _ := b.worker(t, "slow", llm.SimConfig{Latency: 30 * time.Second}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, fast, slow)
	s := spec("fs", 4, 100_000) // round-robin: t00, t02 fast; t01, t03 slow
	s.JoinPolicy = fanoutv1.JoinPolicy_JOIN_POLICY_FIRST_SUCCESS
	start := time.Now()
	fin := checkEvents(t, runStream(t, n.client, s))
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("run ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("run took %s: the rest was not cancelled", d)
	}
	checkDispatchOrder(t, s, fin.GetResult().GetTasks())
	succeeded := 0
	for _, o := range fin.GetResult().GetTasks() {
		switch o.GetStatus() {
		case fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED:
			succeeded++
		case fanoutv1.TaskStatus_TASK_STATUS_CANCELLED:
		default:
			t.Errorf("task %s ended %s", o.GetTaskId(), o.GetStatus())
		}
		if (o.GetTaskId() == "t01" || o.GetTaskId() == "t03") && o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_CANCELLED {
			t.Errorf("slow task %s ended %s, want CANCELLED", o.GetTaskId(), o.GetStatus())
		}
	}
	if succeeded == 0 {
		t.Error("no task succeeded")
	}
	b.checkLedger(t)
}

func TestCancelRunOnAnotherReplica(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "slow", llm.SimConfig{Latency: 30 * time.Second}, 8)
	a := b.orchestrator(t, "a", orchestrator.Config{}, w)
	other := b.orchestrator(t, "b", orchestrator.Config{}, w)

	s := spec("cancel", 5, 100_000)
	s.Limits = &fanoutv1.Limits{MaxConcurrency: 2} // three stay queued
	start, err := a.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := start.GetRunId()

	// Watch from the other replica until a task runs, then cancel there.
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	stream, err := other.client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	var evs []*fanoutv1.RunEvent
	cancelled := false
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, msg.GetEvent())
		if msg.GetEvent().GetTaskStarted() != nil && !cancelled {
			cancelled = true
			began = time.Now()
			resp, err := other.client.CancelRun(t.Context(), &fanoutv1.CancelRunRequest{RunId: runID, Reason: "stop"})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetRun().GetRunId() != runID {
				t.Errorf("CancelRun returned run %s", resp.GetRun().GetRunId())
			}
		}
	}
	fin := checkEvents(t, evs)
	if d := time.Since(began); d > 15*time.Second {
		t.Errorf("cancel took %s", d)
	}
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_CANCELLED || fin.GetCancelCause() != "cancelled by caller: stop" {
		t.Errorf("run ended %s (%q), want CANCELLED by caller: stop", fin.GetState(), fin.GetCancelCause())
	}
	got, err := other.client.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	checkDispatchOrder(t, s, got.GetRun().GetTasks())
	for _, o := range got.GetRun().GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_CANCELLED {
			t.Errorf("task %s ended %s, want CANCELLED", o.GetTaskId(), o.GetStatus())
		}
	}
	// Cancelling again changes nothing.
	again, err := other.client.CancelRun(t.Context(), &fanoutv1.CancelRunRequest{RunId: runID, Reason: "again"})
	if err != nil || again.GetRun().GetCancelCause() != "cancelled by caller: stop" {
		t.Errorf("second CancelRun: %v, cause %q", err, again.GetRun().GetCancelCause())
	}
	b.checkLedger(t)
}

func TestListRunsPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w1", llm.SimConfig{}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w)
	var ids []string
	for i := range 5 {
		r, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: spec(fmt.Sprint("list-", i), 1, 10_000)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.GetRunId())
		watchAll(t, n.client, r.GetRunId())
	}
	var got []string
	token := ""
	for page := 0; ; page++ {
		resp, err := n.client.ListRuns(t.Context(), &fanoutv1.ListRunsRequest{TenantId: "t1", PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.GetRuns() {
			got = append(got, r.GetRunId())
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
		if page > 5 {
			t.Fatal("too many pages")
		}
	}
	if len(got) != 5 {
		t.Fatalf("listed %v, want 5 runs", got)
	}
	for i := range got {
		if got[i] != ids[len(ids)-1-i] {
			t.Errorf("listed %v, want newest first %v", got, ids)
			break
		}
	}
	if _, err := n.client.ListRuns(t.Context(), &fanoutv1.ListRunsRequest{TenantId: "t1", PageToken: "garbage"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("bad page token: %v", err)
	}
}

func TestRunCallerCancelCancelsRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "slow", llm.SimConfig{Latency: 30 * time.Second}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w)
	bounded, stop := context.WithTimeout(t.Context(), patience)
	defer stop()
	ctx, cancel := context.WithCancel(bounded)
	defer cancel()
	stream, err := n.client.Run(ctx, &fanoutv1.RunRequest{Spec: spec("caller", 3, 100_000)})
	if err != nil {
		t.Fatal(err)
	}
	var runID string
	for {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatalf("Run, before a task started: %v", err)
		}
		runID = msg.GetEvent().GetRunId()
		if msg.GetEvent().GetTaskStarted() != nil {
			break
		}
	}
	cancel()
	fin := checkEvents(t, watchAll(t, n.client, runID))
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_CANCELLED || fin.GetCancelCause() != "caller cancelled Run" {
		t.Errorf("run ended %s (%q), want CANCELLED (caller cancelled Run)", fin.GetState(), fin.GetCancelCause())
	}
	b.checkLedger(t)
}

// TestTasksGoElsewhereWhenAWorkerRefuses: a worker that is unreachable
// (UNAVAILABLE) or full (RESOURCE_EXHAUSTED) before it spent anything gets
// the task sent to another one, and every task still succeeds.
func TestTasksGoElsewhereWhenAWorkerRefuses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slow := llm.SimConfig{Latency: 300 * time.Millisecond}
	full, _ := b.worker(t, "full", slow, 1) // room for one subagent at a time
	live, _ := b.worker(t, "live", llm.SimConfig{}, 64)
	dead := "127.0.0.1:1" // nothing listens there
	n := b.orchestrator(t, "o1", orchestrator.Config{RetryBackoff: time.Millisecond}, dead, full, live)

	s := spec("elsewhere", 9, 1_000_000)
	s.Limits = &fanoutv1.Limits{MaxConcurrency: 9}
	fin := checkEvents(t, runStream(t, n.client, s))
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("run ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	checkDispatchOrder(t, s, fin.GetResult().GetTasks())
	byWorker := map[string]int{}
	for _, o := range fin.GetResult().GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			t.Errorf("task %s ended %s: %s", o.GetTaskId(), o.GetStatus(), o.GetSummary().GetError())
		}
		byWorker[o.GetWorker()]++
	}
	if byWorker["live"] == 0 || byWorker["full"] > 3 || len(byWorker) > 2 {
		t.Errorf("tasks by worker %v: want them on live (and at most a few on full), none on the dead address", byWorker)
	}
	// A try sent elsewhere is a new attempt (fencing the one refused),
	// also after a first attempt begun with the run: full, which runs one
	// subagent at a time, refused at least one of the tasks sent to it at once.
	var retried int
	if err := b.pool.QueryRow(t.Context(), `SELECT count(*) FROM account
		WHERE run_id = (SELECT run_id FROM run WHERE idempotency_key = 'elsewhere') AND kind = 'task' AND attempt > 1`).
		Scan(&retried); err != nil {
		t.Fatal(err)
	}
	if retried == 0 {
		t.Error("no task account is past its first attempt: a try sent elsewhere must begin a new one")
	}
	b.checkLedger(t)
}
