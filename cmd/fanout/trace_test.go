package main

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// traceEvents is a run of tasks a and b: a runs, b is not started, and the
// run ends end.
func traceEvents(end fanoutv1.RunState) []*fanoutv1.RunEvent {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	at := func(ms int) *timestamppb.Timestamp {
		return timestamppb.New(t0.Add(time.Duration(ms) * time.Millisecond))
	}
	spec := &fanoutv1.RunSpec{Tasks: []*fanoutv1.TaskSpec{{Id: "a"}, {Id: "b"}}}
	return []*fanoutv1.RunEvent{
		{Sequence: 1, Time: at(0), Event: &fanoutv1.RunEvent_RunStarted{RunStarted: &fanoutv1.RunStarted{Run: &fanoutv1.Run{Spec: spec}}}},
		{Sequence: 2, Time: at(10), Event: &fanoutv1.RunEvent_TaskStarted{TaskStarted: &fanoutv1.TaskStarted{TaskId: "a"}}},
		{Sequence: 3, Time: at(500), Event: &fanoutv1.RunEvent_TaskFinished{TaskFinished: &fanoutv1.TaskFinished{Outcome: &fanoutv1.TaskOutcome{
			TaskId: "a", Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED}}}},
		{Sequence: 4, Time: at(600), Event: &fanoutv1.RunEvent_TaskFinished{TaskFinished: &fanoutv1.TaskFinished{Outcome: &fanoutv1.TaskOutcome{
			TaskId: "b", Status: fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED}}}},
		{Sequence: 5, Time: at(1000), Event: &fanoutv1.RunEvent_RunFinished{RunFinished: &fanoutv1.RunFinished{State: end}}},
	}
}

// TestTraceMarksAForecastExhaustion (found with issue 29's console): a run
// that admission by forecast ended BUDGET_EXHAUSTED sends no
// BudgetExhausted event; trace drew no exhaustion line for it (the demo's
// run), though the README says it does. The line is now at its first task
// not started; a cancelled run with a task not started gets none.
func TestTraceMarksAForecastExhaustion(t *testing.T) {
	axis := func(events []*fanoutv1.RunEvent) string {
		var b strings.Builder
		drawTimeline(&b, events, 50)
		line := strings.Split(b.String(), "\n")[1]
		return line[strings.IndexRune(line, '|')+1 : strings.LastIndex(line, "|")]
	}
	got := axis(traceEvents(fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED))
	if i := strings.IndexRune(got, 'v'); i < 0 {
		t.Errorf("the axis of a run exhausted by forecast: %q; want the exhaustion marked", got)
	} else if want := 49 * 600 / 1000; i != want {
		t.Errorf("the exhaustion marked at column %d of %q; want %d (the first task not started, at 600 of 1000 ms)", i, got, want)
	}
	if got := axis(traceEvents(fanoutv1.RunState_RUN_STATE_CANCELLED)); strings.ContainsRune(got, 'v') {
		t.Errorf("the axis of a cancelled run: %q; want no exhaustion marked", got)
	}
}
