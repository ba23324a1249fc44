package store_test

import (
	"strings"
	"testing"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
)

// TestRunsListSummaries: ListRuns reads summaries — no spec, no result, no
// task summaries — while GetRun reads the whole run.
func TestRunsListSummaries(t *testing.T) {
	b := setup(t)
	rs := store.NewRuns(b.pool)
	r := draftRun("r1", "ten", "k1", "a")
	r.Spec.Goal = strings.Repeat("g", 64<<10)
	if _, _, err := rs.CreateRun(b.ctx, r, "n"); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.FinishTask(b.ctx, "r1", "n", &fanoutv1.TaskOutcome{TaskId: "a", Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED,
		Summary: &fanoutv1.FactSummary{Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED}, TokensSpent: 7}); err != nil {
		t.Fatal(err)
	}
	list, err := rs.ListRuns(b.ctx, "ten", fanoutv1.RunState_RUN_STATE_UNSPECIFIED, time.Time{}, "", 10)
	if err != nil || len(list) != 1 {
		t.Fatalf("ListRuns: %d runs, %v", len(list), err)
	}
	got := list[0]
	if got.GetSpec() != nil || got.GetResult() != nil || len(got.GetTasks()) != 1 || got.GetTasks()[0].GetSummary() != nil {
		t.Errorf("summary has spec %v, result %v, tasks %v: want none of their documents",
			got.GetSpec() != nil, got.GetResult() != nil, got.GetTasks())
	}
	if task := got.GetTasks()[0]; task.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED || task.GetTokensSpent() != 7 ||
		got.GetLabels()["team"] != "a" || got.GetState() != fanoutv1.RunState_RUN_STATE_RUNNING {
		t.Errorf("summary %v: want state, labels and the task's status and spend", got)
	}
	full, err := rs.GetRun(b.ctx, "ten", "r1")
	if err != nil || len(full.GetSpec().GetGoal()) != 64<<10 || full.GetTasks()[0].GetSummary() == nil {
		t.Errorf("GetRun: %v, want the spec and the task summary", err)
	}
}
