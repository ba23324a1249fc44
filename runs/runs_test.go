package runs_test

import (
	"testing"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

func TestTextRoundTrips(t *testing.T) {
	for n := range fanoutv1.RunState_name {
		s := fanoutv1.RunState(n)
		got, err := runs.ParseState(runs.Text(s))
		if s == 0 {
			if err == nil {
				t.Errorf("ParseState(%q) = %v, want an error for the unspecified state", runs.Text(s), got)
			}
			continue
		}
		if err != nil || got != s {
			t.Errorf("ParseState(Text(%v)) = %v, %v", s, got, err)
		}
	}
	for n := range fanoutv1.TaskStatus_name {
		s := fanoutv1.TaskStatus(n)
		if s == 0 {
			continue
		}
		if got, err := runs.ParseStatus(runs.Text(s)); err != nil || got != s {
			t.Errorf("ParseStatus(Text(%v)) = %v, %v", s, got, err)
		}
	}
	if got := runs.Text(fanoutv1.RunState_RUN_STATE_SUCCEEDED); got != "SUCCEEDED" {
		t.Errorf("Text(RUN_STATE_SUCCEEDED) = %q, want SUCCEEDED", got)
	}
	if got := runs.Text(fanoutv1.TaskStatus_TASK_STATUS_BUDGET_EXHAUSTED); got != "BUDGET_EXHAUSTED" {
		t.Errorf("Text(TASK_STATUS_BUDGET_EXHAUSTED) = %q", got)
	}
	if got, err := runs.ParseState("running"); err != nil || got != fanoutv1.RunState_RUN_STATE_RUNNING {
		t.Errorf("ParseState(running) = %v, %v", got, err)
	}
	if _, err := runs.ParseState("RUN_STATE_RUNNING"); err == nil {
		t.Error("ParseState accepted a name with its prefix")
	}
	if _, err := runs.ParseStatus("nope"); err == nil {
		t.Error("ParseStatus accepted nope")
	}
}
