package store_test

import (
	"testing"

	"github.com/fanout/fanout/store"
)

// TestTaskPriorsAddOncePerRunAndHalvePastAThousand: a run's tasks are added
// to its tenant's prior for the model once (an adopter ending the run
// again adds nothing); past 1,000 tasks the old sums are halved before a
// run's are added, so that recent runs weigh more; the peak is never below
// the spend; one tenant's prior is not another's (docs/budget.md#priors).
func TestTaskPriorsAddOncePerRunAndHalvePastAThousand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rs := store.NewRuns(b.pool)
	run := func(id string) string {
		t.Helper()
		if _, _, err := rs.CreateRun(b.ctx, draftRun(id, "acme", "k-"+id, "t0"), "n"); err != nil {
			t.Fatal(err)
		}
		return id
	}
	add := func(runID string, tasks, spent, peak int64) bool {
		t.Helper()
		added, err := rs.AddTaskPrior(b.ctx, runID, "acme", "m", tasks, spent, peak)
		if err != nil {
			t.Fatal(err)
		}
		return added
	}
	want := func(tasks, spent, peak int64) {
		t.Helper()
		n, s, p, err := rs.TaskPrior(b.ctx, "acme", "m")
		if err != nil {
			t.Fatal(err)
		}
		if n != tasks || s != spent || p != peak {
			t.Errorf("prior = %d tasks, %d spent, %d peak; want %d, %d, %d", n, s, p, tasks, spent, peak)
		}
	}
	if n, _, _, err := rs.TaskPrior(b.ctx, "acme", "m"); err != nil || n != 0 {
		t.Fatalf("no prior yet: %d tasks, %v", n, err)
	}
	if !add(run("r1"), 600, 60_000, 90_000) {
		t.Fatal("the first add of r1 added nothing")
	}
	want(600, 60_000, 90_000)
	if add("r1", 600, 60_000, 90_000) {
		t.Error("r1's tasks were added twice")
	}
	want(600, 60_000, 90_000)
	// A peak below the spend is raised to it.
	if !add(run("r2"), 400, 40_000, 10) {
		t.Fatal("r2 added nothing")
	}
	want(1000, 100_000, 130_000)
	// 1,000 tasks: halved first, then r3's added.
	if !add(run("r3"), 10, 2_000, 3_000) {
		t.Fatal("r3 added nothing")
	}
	want(510, 52_000, 68_000)
	// A run that is not there adds nothing.
	if add("gone", 1, 1, 1) {
		t.Error("a run that does not exist added to the prior")
	}
	want(510, 52_000, 68_000)
	if n, _, _, err := rs.TaskPrior(b.ctx, "globex", "m"); err != nil || n != 0 {
		t.Errorf("another tenant reads %d tasks (%v), want none", n, err)
	}
}
