package orchestrator

import (
	"strings"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// TestSynthesisIsToldHowEveryTaskEnded: the synthesis call's instruction
// lists each task's status and, for those that did not succeed, its error
// (cut at reportErrorBytes), not only the facts of those that did.
func TestSynthesisIsToldHowEveryTaskEnded(t *testing.T) {
	d := &driver{e: &Engine{cfg: Config{DefaultTaskTimeout: time.Minute}}, runID: "r",
		p: &plan{spec: &fanoutv1.RunSpec{Goal: "g"}, tenantID: "t", minReservation: 10}}
	long := strings.Repeat("é", reportErrorBytes)
	result := &fanoutv1.JoinedResult{
		Facts: []*fanoutv1.Fact{{Text: "a fact"}},
		Tasks: []*fanoutv1.TaskOutcome{
			{TaskId: "good", Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED, Summary: &fanoutv1.FactSummary{}},
			{TaskId: "bad", Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED, Summary: &fanoutv1.FactSummary{Error: "the model failed"}},
			{TaskId: "slow", Status: fanoutv1.TaskStatus_TASK_STATUS_TIMED_OUT, Summary: &fanoutv1.FactSummary{Error: long}},
			{TaskId: "skipped", Status: fanoutv1.TaskStatus_TASK_STATUS_SKIPPED},
		},
	}

	got := d.synthesisRequest(budget.Account{}, result).GetTask().GetInstruction()

	for _, want := range []string{synthesisInstruction, "- good: SUCCEEDED\n", "- bad: FAILED: the model failed\n", "- skipped: SKIPPED"} {
		if !strings.Contains(got, want) {
			t.Errorf("the synthesis instruction lacks %q:\n%s", want, got)
		}
	}
	if i := strings.Index(got, "- slow: TIMED_OUT: "); i < 0 || !strings.HasSuffix(got[:strings.Index(got, "\n- skipped")], "…") ||
		len(got[i:strings.Index(got, "\n- skipped")]) > len("- slow: TIMED_OUT: ")+reportErrorBytes+len("…") {
		t.Errorf("the timed-out task's error is not listed cut at %d bytes:\n%s", reportErrorBytes, got)
	}
}
