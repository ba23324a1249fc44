package orchestrator

import (
	"context"
	"io"
	"log/slog"
	"testing"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// priorLog is a TaskPriors that records what is added.
type priorLog struct {
	runID         string
	tasks, spent  int64
	peak, written int64
}

func (*priorLog) TaskPrior(context.Context, string, string) (int64, int64, int64, error) {
	return 0, 0, 0, nil
}

func (p *priorLog) AddTaskPrior(_ context.Context, runID, _, _ string, tasks, spent, peak int64) (bool, error) {
	p.runID, p.tasks, p.spent, p.peak = runID, tasks, spent, peak
	p.written++
	return true, nil
}

// TestAShortStartIsNotAPrior: docs/budget.md#priors. A short start (wound
// down from its start) that answered in its one iteration without a tool
// call was never told to wind down (its summary says wound_down false), yet
// it had less than its forecast: it is not added to the tenant's prior.
// Nor is a task that ended before the run was adopted (not dispatched by
// this driver), nor one wound down; the whole tasks are, with the run's id.
func TestAShortStartIsNotAPrior(t *testing.T) {
	answered := func(spent, peak int64, woundDown bool) *fanoutv1.TaskOutcome {
		return &fanoutv1.TaskOutcome{Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED, TokensSpent: spent,
			Summary: &fanoutv1.FactSummary{Iterations: 1, PeakTokens: peak, WoundDown: woundDown}}
	}
	priors := &priorLog{}
	d := &driver{e: &Engine{priors: priors, cfg: Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}},
		ar: newActiveRun(func(error) {}), runID: "r", p: &plan{tenantID: "acme", spec: &fanoutv1.RunSpec{}},
		outcomes: []*fanoutv1.TaskOutcome{
			answered(1_000, 1_500, false), // whole
			answered(400, 600, false),     // short-started, answered at once
			answered(900, 1_200, true),    // wound down
			answered(700, 800, false),     // ended before an adoption
			answered(2_000, 2_500, false), // whole
		},
		whole: []bool{true, false, true, false, true}}
	d.addPrior(t.Context())
	if priors.written != 1 || priors.runID != "r" || priors.tasks != 2 || priors.spent != 3_000 || priors.peak != 4_000 {
		t.Errorf("added %d times, run %q: %d tasks, %d spent, %d peak; want once for run r: 2 tasks, 3,000 spent, 4,000 peak",
			priors.written, priors.runID, priors.tasks, priors.spent, priors.peak)
	}
}
