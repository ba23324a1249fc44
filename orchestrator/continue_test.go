package orchestrator_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store"
)

// checkEnds checks the invariants of a continued run's history, one end at
// a time (docs/budget.md#continue): each end is a RunFinished, the first
// after RunStarted, each later one after a RunContinued that reopened the
// run; each end that was BUDGET_EXHAUSTED has one BudgetExhausted of its
// own before it. It returns the RunFinished events in order.
func checkEnds(t *testing.T, evs []*fanoutv1.RunEvent) []*fanoutv1.RunFinished {
	t.Helper()
	for i, ev := range evs {
		if ev.GetSequence() != int64(i+1) {
			t.Fatalf("event %d has sequence %d", i, ev.GetSequence())
		}
	}
	if len(evs) == 0 || evs[0].GetRunStarted() == nil {
		t.Fatal("the first event is not RunStarted")
	}
	var ends []*fanoutv1.RunFinished
	marks, open := 0, true
	for _, ev := range evs {
		switch {
		case ev.GetBudgetExhausted() != nil:
			if !open {
				t.Errorf("event %d: BudgetExhausted after the run ended", ev.GetSequence())
			}
			marks++
		case ev.GetRunContinued().GetReopened():
			if open {
				t.Errorf("event %d: a RunContinued reopens a run that had not ended", ev.GetSequence())
			}
			open, marks = true, 0
		case ev.GetRunFinished() != nil:
			fin := ev.GetRunFinished()
			if !open {
				t.Errorf("event %d: a second RunFinished without a RunContinued between", ev.GetSequence())
			}
			if want := 0; fin.GetState() == fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED {
				want = 1
				if marks != want {
					t.Errorf("end %d (event %d) is BUDGET_EXHAUSTED with %d BudgetExhausted events; want one per end",
						len(ends)+1, ev.GetSequence(), marks)
				}
			} else if marks > 1 {
				t.Errorf("end %d has %d BudgetExhausted events", len(ends)+1, marks)
			}
			ends = append(ends, fin)
			open = false
		case open:
		default:
			t.Errorf("event %d (%T) after the run ended, before a RunContinued", ev.GetSequence(), ev.GetEvent())
		}
	}
	if open {
		t.Fatalf("the run's history does not end with a RunFinished (%d ends)", len(ends))
	}
	return ends
}

// TestContinueExhaustedRunTwice (docs/budget.md#continue): a demo-sized
// run under admission by forecast ends BUDGET_EXHAUSTED with tasks
// NOT_STARTED; continued once it runs some and exhausts again; continued a
// second time it ends with every task SUCCEEDED. No task succeeds twice
// or is dispatched after it ended, the ledger is conserved and never
// overspent, and the run_continuations view itemises each
// continuation's spend.
func TestContinueExhaustedRunTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workers := b.demoWorkers(t)
	n := b.orchestrator(t, "o", orchestrator.Config{}, workers...)
	s := demoSpec(t, "continued", 6_000, fanoutv1.AdmissionPolicy_ADMISSION_POLICY_FORECAST)
	evs := runStream(t, n.client, s)
	runID := evs[0].GetRunId()
	if fin := checkEvents(t, evs); fin.GetState() != fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED {
		t.Fatalf("run ended %s, want BUDGET_EXHAUSTED", fin.GetState())
	}
	first := tally(evs)
	if first[fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED] == 0 {
		t.Fatal("no task NOT_STARTED: nothing to continue")
	}
	t.Logf("first end: %v", first)

	cont := func(key string, add int64) *fanoutv1.ContinueRunResponse {
		t.Helper()
		res, err := n.client.ContinueRun(t.Context(), &fanoutv1.ContinueRunRequest{RunId: runID, AddTokens: add,
			IdempotencyKey: key, Reason: "more"})
		if err != nil {
			t.Fatalf("ContinueRun %s: %v", key, err)
		}
		if !res.GetContinuation().GetReopened() {
			t.Fatalf("ContinueRun %s did not reopen the ended run: %v", key, res.GetContinuation())
		}
		return res
	}
	c1 := cont("c1", 3_000)
	evs = watchAll(t, n.client, runID)
	ends := checkEnds(t, evs)
	t.Logf("after c1 (%v): ends %d, tasks %v", c1.GetContinuation(), len(ends), tally(evs))
	// The second continuation's quote first: the tasks it runs are those
	// still NOT_STARTED, and nothing is written.
	dry, err := n.client.ContinueRun(t.Context(), &fanoutv1.ContinueRunRequest{RunId: runID, AddTokens: 20_000,
		IdempotencyKey: "c2", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	left := tally(evs)[fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED]
	running := 0
	for _, l := range dry.GetQuote().GetTasks() {
		if l.GetRuns() {
			running++
		}
	}
	if dry.GetContinuation() != nil || running != left || dry.GetQuote().GetBasis() != "run" ||
		dry.GetQuote().GetLimitTokens() != 6_000+3_000+20_000 {
		t.Errorf("the quote of c2: continuation %v, %d tasks run (want the %d NOT_STARTED), basis %q (want run), limit %d",
			dry.GetContinuation(), running, left, dry.GetQuote().GetBasis(), dry.GetQuote().GetLimitTokens())
	}
	c2 := cont("c2", 20_000)
	if replay, err := n.client.ContinueRun(t.Context(), &fanoutv1.ContinueRunRequest{RunId: runID, AddTokens: 20_000,
		IdempotencyKey: "c2"}); err != nil || replay.GetContinuation().GetContinuation() != c2.GetContinuation().GetContinuation() {
		t.Errorf("a retry of c2: %v, %v; want c2's continuation again", replay.GetContinuation(), err)
	}
	evs = watchAll(t, n.client, runID)
	ends = checkEnds(t, evs)
	last := ends[len(ends)-1]
	if last.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("after two continuations the run ended %s (%q), want SUCCEEDED", last.GetState(), last.GetCancelCause())
	}
	run, err := n.client.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range run.GetRun().GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			t.Errorf("task %s ended %s, want SUCCEEDED", o.GetTaskId(), o.GetStatus())
		}
	}
	if got, want := run.GetRun().GetBudget().GetLimitTokens(), int64(6_000+3_000+20_000); got != want {
		t.Errorf("run limit %d, want %d", got, want)
	}
	// No task ran after it succeeded: one SUCCEEDED TaskFinished each.
	succeeded := map[string]int{}
	for _, ev := range evs {
		if o := ev.GetTaskFinished().GetOutcome(); o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			succeeded[o.GetTaskId()]++
		}
	}
	for id, k := range succeeded {
		if k != 1 {
			t.Errorf("task %s SUCCEEDED %d times", id, k)
		}
	}
	b.checkLedger(t)
	b.checkRunJournal(t, runID)
	// The audit view: one row per continuation, whose spends and the
	// first end's add up to the run's.
	var rows int
	var spent, total int64
	if err := b.pool.QueryRow(t.Context(), `SELECT count(*), coalesce(sum(spent_tokens), 0)::bigint,
		       (SELECT spent FROM account WHERE run_id = $1 AND kind = 'run')
		  FROM run_continuations WHERE run_id = $1`, runID).Scan(&rows, &spent, &total); err != nil {
		t.Fatal(err)
	}
	if rows != 2 || spent+c1.GetContinuation().GetSpentBefore() != total {
		t.Errorf("run_continuations: %d rows spending %d after %d before the first; the run spent %d: want 2 rows adding up",
			rows, spent, c1.GetContinuation().GetSpentBefore(), total)
	}
	t.Logf("spent %d before, %d in 2 continuations, %d in all", c1.GetContinuation().GetSpentBefore(), spent, total)
	// The quote against what the continuation then spent (its tasks and
	// its synthesis), reported, not asserted: a forecast is not a bound.
	var second int64
	if err := b.pool.QueryRow(t.Context(), `SELECT spent_tokens FROM run_continuations WHERE run_id = $1 AND continuation = 2`,
		runID).Scan(&second); err != nil {
		t.Fatal(err)
	}
	q := dry.GetQuote().GetForecastTokens()
	t.Logf("c2's quote: %d tokens forecast, %d spent: error %+.1f%%", q, second, 100*float64(q-second)/float64(second))
}

// tally counts the tasks' last outcomes in a history.
func tally(evs []*fanoutv1.RunEvent) map[fanoutv1.TaskStatus]int {
	last := map[string]fanoutv1.TaskStatus{}
	for _, ev := range evs {
		if o := ev.GetTaskFinished().GetOutcome(); o != nil {
			last[o.GetTaskId()] = o.GetStatus()
		}
	}
	out := map[fanoutv1.TaskStatus]int{}
	for _, s := range last {
		out[s]++
	}
	return out
}

// TestContinueRefusals: a continuation the ledger cannot make writes
// nothing and says why, naming the field.
func TestContinueRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w", demoSim, 16)
	n := b.orchestrator(t, "o", orchestrator.Config{}, w)
	evs := runStream(t, n.client, spec("refusals", 2, 200_000))
	runID := evs[0].GetRunId()
	for _, c := range []struct {
		name string
		req  *fanoutv1.ContinueRunRequest
		code codes.Code
	}{
		{"no key", &fanoutv1.ContinueRunRequest{RunId: runID, AddTokens: 10}, codes.InvalidArgument},
		{"zero", &fanoutv1.ContinueRunRequest{RunId: runID, IdempotencyKey: "k"}, codes.InvalidArgument},
		{"unknown", &fanoutv1.ContinueRunRequest{RunId: "nope", AddTokens: 10, IdempotencyKey: "k"}, codes.NotFound},
		{"succeeded", &fanoutv1.ContinueRunRequest{RunId: runID, AddTokens: 10, IdempotencyKey: "k"}, codes.FailedPrecondition},
	} {
		_, err := n.client.ContinueRun(t.Context(), c.req)
		if status.Code(err) != c.code {
			t.Errorf("%s: %v, want %s", c.name, err, c.code)
		}
	}
	var k int
	if err := b.pool.QueryRow(t.Context(), `SELECT count(*) FROM run_continuation`).Scan(&k); err != nil || k != 0 {
		t.Errorf("%d continuations recorded (%v), want none", k, err)
	}
}

// TestTopUpOfARunningRun (docs/budget.md#continue): a run continued while
// it runs is topped up: its forecast admits against the larger limit when
// it would have declined a task, so it ends once, SUCCEEDED, with no
// BudgetExhausted and one RunContinued that did not reopen it.
func TestTopUpOfARunningRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slow := demoSim
	slow.Latency = 500 * time.Millisecond // a task takes 1.5 s: the top-up lands before the first decline
	w, _ := b.worker(t, "w", slow, 64)
	n := b.orchestrator(t, "o", orchestrator.Config{}, w)
	started, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{
		Spec: demoSpec(t, "topped-up", 6_000, fanoutv1.AdmissionPolicy_ADMISSION_POLICY_FORECAST)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := n.client.ContinueRun(t.Context(), &fanoutv1.ContinueRunRequest{RunId: started.GetRunId(),
		AddTokens: 40_000, IdempotencyKey: "top-up"})
	if err != nil {
		t.Fatal(err)
	}
	if res.GetContinuation().GetReopened() || res.GetContinuation().GetLimitTokens() != 46_000 {
		t.Errorf("top-up %v: want limit 46000, not reopened", res.GetContinuation())
	}
	evs := watchAll(t, n.client, started.GetRunId())
	fin := checkEvents(t, evs)
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("the topped-up run ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	if got := tally(evs); got[fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED] != len(fin.GetResult().GetTasks()) {
		t.Errorf("tasks ended %v, want all SUCCEEDED", got)
	}
	if marks := exhaustionMarks(evs); len(marks) != 0 {
		t.Errorf("BudgetExhausted at %v in a run topped up in time", marks)
	}
	b.checkLedger(t)
	b.checkRunJournal(t, started.GetRunId())
}

// TestAdoptedContinuationIsMarkedAgain (docs/budget.md#continue): a run
// reopened by a node that died before it drove it is adopted; when its
// budget runs out again, that end gets its own BudgetExhausted although
// the log already has the first end's. The run was created a day before:
// its timeout counts from the continuation, so the adopter does not time
// it out.
func TestAdoptedContinuationIsMarkedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w", demoSim, 64)
	n := b.orchestrator(t, "o", orchestrator.Config{}, w)
	evs := runStream(t, n.client, demoSpec(t, "adopted-continuation", 6_000, fanoutv1.AdmissionPolicy_ADMISSION_POLICY_FORECAST))
	runID := evs[0].GetRunId()
	if fin := checkEvents(t, evs); fin.GetState() != fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED {
		t.Fatalf("run ended %s, want BUDGET_EXHAUSTED", fin.GetState())
	}
	var notStarted []string
	for _, ev := range evs {
		if o := ev.GetTaskFinished().GetOutcome(); o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED {
			notStarted = append(notStarted, o.GetTaskId())
		}
	}
	var held int64
	if err := b.pool.QueryRow(t.Context(), `SELECT delta_held FROM ledger_entry WHERE run_id = $1 AND kind = 'hold'
		ORDER BY entry_id LIMIT 1`, runID).Scan(&held); err != nil {
		t.Fatal(err)
	}
	// The continuation as a node that then died wrote it: the run reopened,
	// owned by "ghost", driven by nobody.
	if _, err := store.NewRuns(b.pool).ContinueRun(t.Context(), runs.Continue{RunID: runID, TenantID: "t1", Key: "k",
		Owner: "ghost", Actor: "key:x", Add: 2_000, Held: held, MaxLimit: 1 << 40, Tasks: notStarted}); err != nil {
		t.Fatal(err)
	}
	// Created a day ago: the reopened run's timeout counts from its
	// continuation, also for the node that adopts it.
	if _, err := b.pool.Exec(t.Context(), `UPDATE run SET created_at = now() - interval '1 day' WHERE run_id = $1`, runID); err != nil {
		t.Fatal(err)
	}
	orphan(t, b, runID)
	r := b.orchestrator(t, "r", leaseConfig(), w)
	evs = watchAll(t, r.client, runID)
	ends := checkEnds(t, evs)
	if len(ends) != 2 || ends[1].GetState() != fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED {
		t.Fatalf("ends %v, want two, the second BUDGET_EXHAUSTED (2,000 more tokens do not pay for every task)", ends)
	}
	b.checkLedger(t)
}

// TestWatchGoesOnPastAnEndAtAPageBoundary (docs/budget.md#continue): a
// watch from the start of a continued run gets every event, also when its
// first RunFinished is the last event of a page (the watch reads 256 at a
// time): it ends only at a RunFinished with nothing after it.
func TestWatchGoesOnPastAnEndAtAPageBoundary(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := b.orchestrator(t, "o1", orchestrator.Config{OrphanAfter: time.Hour})
	runID := b.storedRun(t, "page-boundary")
	b.queueTasks(t, runID, 254, 10)
	if first := b.finishStored(t, runID); first != 256 {
		t.Fatalf("the first RunFinished is event %d, want 256 (a page's last)", first)
	}
	// The run reopened, as ledger_continue_run and its RunContinued do it
	// in one write, then ended again.
	if _, err := b.pool.Exec(t.Context(), `UPDATE fanout.run SET state = 'RUNNING', finished_at = NULL WHERE run_id = $1`, runID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.backend.Runs().AppendEvent(t.Context(), runID, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_RunContinued{
		RunContinued: &fanoutv1.RunContinued{Continuation: 1, AddedTokens: 10, Reopened: true}}}); err != nil {
		t.Fatal(err)
	}
	last := b.finishStored(t, runID)
	evs := watchAll(t, n.client, runID)
	if len(evs) == 0 || evs[len(evs)-1].GetSequence() != last {
		t.Fatalf("the watch got %d events, want every one through the second RunFinished (%d)", len(evs), last)
	}
	checkSequences(t, "watch", evs, 1)
}

// TestContinueRetryAtTheCap (docs/budget.md#continue): a retry of a
// continuation that brought the run's budget to the server's cap is
// answered with that continuation, not refused for the cap it reached;
// the same key with another amount is a conflict.
func TestContinueRetryAtTheCap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w", demoSim, 64)
	n := b.orchestrator(t, "o", orchestrator.Config{MaxRunTokens: 9_000}, w)
	evs := runStream(t, n.client, demoSpec(t, "at-the-cap", 6_000, fanoutv1.AdmissionPolicy_ADMISSION_POLICY_FORECAST))
	runID := evs[0].GetRunId()
	req := &fanoutv1.ContinueRunRequest{RunId: runID, AddTokens: 3_000, IdempotencyKey: "to-the-cap"}
	first, err := n.client.ContinueRun(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := n.client.ContinueRun(t.Context(), req)
	if err != nil || again.GetContinuation().GetContinuation() != first.GetContinuation().GetContinuation() {
		t.Errorf("the retry: %v, %v; want continuation %d again", again.GetContinuation(), err, first.GetContinuation().GetContinuation())
	}
	other := proto.CloneOf(req)
	other.AddTokens = 1
	if _, err := n.client.ContinueRun(t.Context(), other); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("the key with another amount: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := n.client.ContinueRun(t.Context(), &fanoutv1.ContinueRunRequest{RunId: runID, AddTokens: 1,
		IdempotencyKey: "past-the-cap"}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a new continuation past the cap: %v, want RESOURCE_EXHAUSTED", err)
	}
	watchAll(t, n.client, runID)
}
