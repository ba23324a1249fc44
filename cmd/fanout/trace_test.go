package main

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// traceEvents is a run of tasks a and b: a runs, b is not started, and the
// run ends end; marked says whether its log has a BudgetExhausted (at 550
// ms, when b was declined).
func traceEvents(end fanoutv1.RunState, marked bool) []*fanoutv1.RunEvent {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	at := func(ms int) *timestamppb.Timestamp {
		return timestamppb.New(t0.Add(time.Duration(ms) * time.Millisecond))
	}
	spec := &fanoutv1.RunSpec{Tasks: []*fanoutv1.TaskSpec{{Id: "a"}, {Id: "b"}}}
	evs := []*fanoutv1.RunEvent{
		{Time: at(0), Event: &fanoutv1.RunEvent_RunStarted{RunStarted: &fanoutv1.RunStarted{Run: &fanoutv1.Run{Spec: spec}}}},
		{Time: at(10), Event: &fanoutv1.RunEvent_TaskStarted{TaskStarted: &fanoutv1.TaskStarted{TaskId: "a"}}},
		{Time: at(500), Event: &fanoutv1.RunEvent_TaskFinished{TaskFinished: &fanoutv1.TaskFinished{Outcome: &fanoutv1.TaskOutcome{
			TaskId: "a", Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED}}}},
		{Time: at(510), Event: &fanoutv1.RunEvent_BudgetUpdate{BudgetUpdate: &fanoutv1.BudgetUpdate{
			Budget: &fanoutv1.BudgetSnapshot{LimitTokens: 1000, SpentTokens: 990, Exhausted: true}}}},
	}
	if marked {
		evs = append(evs, &fanoutv1.RunEvent{Time: at(550), Event: &fanoutv1.RunEvent_BudgetExhausted{
			BudgetExhausted: &fanoutv1.BudgetExhausted{}}})
	}
	evs = append(evs,
		&fanoutv1.RunEvent{Time: at(600), Event: &fanoutv1.RunEvent_TaskFinished{TaskFinished: &fanoutv1.TaskFinished{Outcome: &fanoutv1.TaskOutcome{
			TaskId: "b", Status: fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED}}}},
		&fanoutv1.RunEvent{Time: at(1000), Event: &fanoutv1.RunEvent_RunFinished{RunFinished: &fanoutv1.RunFinished{State: end}}})
	for i, ev := range evs {
		ev.Sequence = int64(i + 1)
	}
	return evs
}

// TestTraceMarksTheExhaustionEvent: the line across the timeline is where
// the run's one BudgetExhausted is (docs/budget.md, "When the budget ran
// out"), whatever else the log says: a run's log without one (a cancelled
// run with a task not started, or one whose snapshot said exhausted) gets
// no line, as trace no longer derives the moment from other events. (Found
// with issue 29's console: trace drew no line for the demo's run, which
// admission by forecast ended BUDGET_EXHAUSTED without the event; the
// engine now sends it for that run too.)
func TestTraceMarksTheExhaustionEvent(t *testing.T) {
	axis := func(events []*fanoutv1.RunEvent) string {
		var b strings.Builder
		drawTimeline(&b, events, 50)
		line := strings.Split(b.String(), "\n")[1]
		return line[strings.IndexRune(line, '|')+1 : strings.LastIndex(line, "|")]
	}
	got := axis(traceEvents(fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED, true))
	if i := strings.IndexRune(got, 'v'); i < 0 {
		t.Errorf("the axis of a run with a BudgetExhausted: %q; want the exhaustion marked", got)
	} else if want := 49 * 550 / 1000; i != want {
		t.Errorf("the exhaustion marked at column %d of %q; want %d (the BudgetExhausted, at 550 of 1000 ms)", i, got, want)
	}
	for _, end := range []fanoutv1.RunState{fanoutv1.RunState_RUN_STATE_CANCELLED, fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED} {
		if got := axis(traceEvents(end, false)); strings.ContainsRune(got, 'v') {
			t.Errorf("the axis of a run that ended %s without a BudgetExhausted: %q; want no exhaustion marked", end, got)
		}
	}
}

// TestTraceAndProgressSayAHedge: a hedged task's row in the trace has an h
// where its second attempt started, and says which attempt won and what
// each spent; the live progress prints the TaskHedged and the outcome the
// same way (docs/budget.md#hedged-tasks).
func TestTraceAndProgressSayAHedge(t *testing.T) {
	evs := traceEvents(fanoutv1.RunState_RUN_STATE_SUCCEEDED, false)
	hedged := &fanoutv1.TaskHedged{TaskId: "a", Worker: "10.0.0.2:7001", After: durationpb.New(260 * time.Millisecond),
		Threshold: durationpb.New(250 * time.Millisecond), Reason: "3 × the median 83ms of 3 tasks that answered"}
	evs = append(evs[:2:2], append([]*fanoutv1.RunEvent{{Time: timestamppb.New(evs[1].GetTime().AsTime().Add(250 * time.Millisecond)),
		Event: &fanoutv1.RunEvent_TaskHedged{TaskHedged: hedged}}}, evs[2:]...)...)
	fin := evs[3].GetTaskFinished().GetOutcome()
	fin.TokensSpent = 390
	fin.Hedge = &fanoutv1.HedgeReport{Winner: fanoutv1.HedgeAttempt_HEDGE_ATTEMPT_HEDGE, FirstTokens: 267, HedgeTokens: 123,
		HedgeWorker: "fast", StartedAfter: durationpb.New(260 * time.Millisecond)}
	for i, ev := range evs {
		ev.Sequence = int64(i + 1)
	}
	var b strings.Builder
	drawTimeline(&b, evs, 50)
	var row string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, "a ") {
			row = l
		}
	}
	bar := row[strings.IndexRune(row, '|')+1 : strings.LastIndex(row, "|")]
	if i, want := strings.IndexRune(bar, 'h'), 49*260/1000; i != want {
		t.Errorf("task a's row %q: the hedge marked at column %d, want %d (its TaskHedged, at 260 of 1000 ms)", row, i, want)
	}
	const said = "hedged after 260ms: the hedge won; first 267 + hedge 123 tokens"
	if !strings.Contains(row, said) {
		t.Errorf("task a's row %q does not say %q", row, said)
	}
	var out strings.Builder
	p := newProgress(&out)
	for _, ev := range evs {
		p.apply(ev)
	}
	for _, want := range []string{"a                hedged: a second attempt on 10.0.0.2:7001 after 260ms (threshold 250ms: 3 × the median 83ms of 3 tasks that answered)",
		"a                SUCCEEDED after 0 iterations, 390 tokens (" + said + ")"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("progress:\n%s\nwant a line %q", out.String(), want)
		}
	}
}
