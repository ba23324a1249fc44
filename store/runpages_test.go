package store_test

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store"
)

// TestRunTaskAndFactPages: RunTasks and RunFacts read a page of a run's
// tasks (by dispatch index) and of its joined facts, with their totals;
// the pages of a run add up to GetRun's lists, in order; another tenant's
// run is not found; a running run has no facts.
func TestRunTaskAndFactPages(t *testing.T) {
	b := setup(t)
	rs := store.NewRuns(b.pool)
	var ids []string
	for i := range 25 {
		ids = append(ids, fmt.Sprintf("t%02d", i))
	}
	if _, _, err := rs.CreateRun(b.ctx, draftRun("r1", "ten", "k1", ids...), "n"); err != nil {
		t.Fatal(err)
	}
	if facts, total, err := rs.RunFacts(b.ctx, "ten", "r1", 0, 10); err != nil || total != 0 || len(facts) != 0 {
		t.Errorf("facts of a running run: %d of %d, %v; want none", len(facts), total, err)
	}
	res := &fanoutv1.JoinedResult{}
	for i := range 23 {
		res.Facts = append(res.Facts, &fanoutv1.Fact{Text: fmt.Sprintf("fact %d", i), Sources: []string{"s", fmt.Sprint(i)}})
	}
	if _, _, err := rs.FinishRun(b.ctx, "r1", "n", fanoutv1.RunState_RUN_STATE_SUCCEEDED, "", res); err != nil {
		t.Fatal(err)
	}
	full, err := rs.GetRun(b.ctx, "ten", "r1")
	if err != nil {
		t.Fatal(err)
	}
	var tasks []*fanoutv1.TaskOutcome
	for from := 0; ; from += 10 {
		page, total, err := rs.RunTasks(b.ctx, "ten", "r1", from, 10)
		if err != nil || total != 25 {
			t.Fatalf("tasks from %d: total %d, %v", from, total, err)
		}
		if len(page) == 0 {
			break
		}
		tasks = append(tasks, page...)
	}
	if !proto.Equal(&fanoutv1.Run{Tasks: tasks}, &fanoutv1.Run{Tasks: full.GetTasks()}) {
		t.Errorf("task pages: %d tasks, not GetRun's %d in order", len(tasks), len(full.GetTasks()))
	}
	var facts []*fanoutv1.Fact
	for from := 0; ; from += 7 {
		page, total, err := rs.RunFacts(b.ctx, "ten", "r1", from, 7)
		if err != nil || total != 23 {
			t.Fatalf("facts from %d: total %d, %v", from, total, err)
		}
		if len(page) == 0 {
			break
		}
		facts = append(facts, page...)
	}
	if !proto.Equal(&fanoutv1.JoinedResult{Facts: facts}, &fanoutv1.JoinedResult{Facts: full.GetResult().GetFacts()}) {
		t.Errorf("fact pages: %d facts, not GetRun's %d in order", len(facts), len(full.GetResult().GetFacts()))
	}
	if _, _, err := rs.RunTasks(b.ctx, "other", "r1", 0, 10); !errors.Is(err, runs.ErrNotFound) {
		t.Errorf("another tenant's RunTasks: %v, want not found", err)
	}
	if _, _, err := rs.RunFacts(b.ctx, "other", "r1", 0, 10); !errors.Is(err, runs.ErrNotFound) {
		t.Errorf("another tenant's RunFacts: %v, want not found", err)
	}
}
