package orchestrator

import (
	"fmt"
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

// TestSynthesisAllowanceIsSized: without budget.synthesis_tokens a run that
// asks for synthesis holds back the output cap plus 256 per task and 512,
// at most a quarter of its budget and never the tasks' minimum; with it,
// what it says; without synthesis, nothing.
func TestSynthesisAllowanceIsSized(t *testing.T) {
	c := Config{}.withDefaults()
	spec := func(limit, held int64, synthesize bool, tasks int) *fanoutv1.RunSpec {
		s := &fanoutv1.RunSpec{IdempotencyKey: "k", Synthesize: synthesize,
			Budget: &fanoutv1.Budget{LimitTokens: limit, MinReservationTokens: 100, SynthesisTokens: held}}
		for i := range tasks {
			s.Tasks = append(s.Tasks, &fanoutv1.TaskSpec{Id: fmt.Sprint("t", i), Instruction: "x", TokenBudget: 1000})
		}
		return s
	}
	for _, tc := range []struct {
		name        string
		limit, held int64
		synthesize  bool
		tasks       int
		want        int64
	}{
		{"sized", 100_000, 0, true, 8, 1024 + 8*256 + 512},
		{"a quarter of a small budget", 12_000, 0, true, 8, 3000},
		{"set in the spec", 12_000, 5000, true, 8, 5000},
		{"no synthesis", 12_000, 0, false, 8, 0},
	} {
		p, err := c.plan(spec(tc.limit, tc.held, tc.synthesize, tc.tasks))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if p.synthesisHeld != tc.want {
			t.Errorf("%s: holds %d, want %d", tc.name, p.synthesisHeld, tc.want)
		}
	}
}

// TestFitFactsKeepsDispatchOrder: the facts that fit are the first ones;
// the count of the rest is returned.
func TestFitFactsKeepsDispatchOrder(t *testing.T) {
	facts := []*fanoutv1.Fact{{Text: "aaaa"}, {Text: "bbbb", Sources: []string{"s"}}, {Text: "cccc"}}
	// "aaaa" costs 4+6, "bbbb [s]" 4+6+3.
	kept, left := fitFacts(facts, 10+13)
	if len(kept) != 2 || kept[1].GetText() != "bbbb" || left != 1 {
		t.Errorf("kept %v, left %d; want the first two kept, one left", kept, left)
	}
	if kept, left := fitFacts(facts, 1000); len(kept) != 3 || left != 0 {
		t.Errorf("with room for all: kept %d, left %d", len(kept), left)
	}
	if kept, left := fitFacts(facts, 9); len(kept) != 0 || left != 3 {
		t.Errorf("with room for none: kept %d, left %d", len(kept), left)
	}
}

// TestSynthesisIsPaidFromTheLarger: an exhausted run's synthesis is paid
// from what it held back; an open run's from what is left when that is
// more (the allowance is released at its close), else from the allowance;
// never with a grant that would exhaust the run (its min_reservation is
// kept), which would cut the synthesis off.
func TestSynthesisIsPaidFromTheLarger(t *testing.T) {
	for _, tc := range []struct {
		name     string
		acct     budget.Account
		pay      int64
		fromHeld bool
	}{
		{"exhausted", budget.Account{Limit: 1000, Spent: 900, Held: 100, MinReservation: 50, State: budget.StateExhausted}, 100, true},
		{"open, more left than held", budget.Account{Limit: 1000, Spent: 100, Held: 300, MinReservation: 50, State: budget.StateOpen}, 550, false},
		// 350 are available, but a grant of more than 300 would exhaust
		// the run under its synthesis.
		{"open, less left than held", budget.Account{Limit: 1000, Spent: 350, Held: 300, MinReservation: 50, State: budget.StateOpen}, 300, true},
		{"nothing held", budget.Account{Limit: 1000, Spent: 100, MinReservation: 50, State: budget.StateOpen}, 850, false},
	} {
		if pay, fromHeld := synthesisPay(tc.acct); pay != tc.pay || fromHeld != tc.fromHeld {
			t.Errorf("%s: pays %d from held %v; want %d, %v", tc.name, pay, fromHeld, tc.pay, tc.fromHeld)
		}
	}
}
