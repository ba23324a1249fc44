package main

import (
	"strings"
	"testing"
	"time"

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
