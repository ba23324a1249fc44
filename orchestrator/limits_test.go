package orchestrator_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/llm"
)

// TestListRunsSummaries: ListRuns over runs with large specs returns
// summaries — no spec, no result, no task summaries — in pages of at most
// 100 however many are asked for, and stays small; GetRun returns the run
// whole. (One page_size:500 over such runs took an orchestrator from 190 MB
// to 1.44 GB RSS.)
func TestListRunsSummaries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w1", llm.SimConfig{}, 8)
	// The runs made in the store below are nobody's: never adopt them.
	n := b.orchestrator(t, "o1", orchestrator.Config{OrphanAfter: time.Hour}, w)
	big := strings.Repeat("a large goal ", 32<<10/13) // 32 KiB per spec

	const stored = 104
	for i := range stored {
		r := &fanoutv1.Run{RunId: fmt.Sprintf("stored-%03d", i), TenantId: "t1", IdempotencyKey: fmt.Sprint("k", i),
			Spec:  &fanoutv1.RunSpec{IdempotencyKey: fmt.Sprint("k", i), TenantId: "t1", Goal: big},
			Tasks: []*fanoutv1.TaskOutcome{{TaskId: "t00"}}}
		if _, _, err := b.backend.Runs().CreateRun(t.Context(), r, "o1"); err != nil {
			t.Fatal(err)
		}
	}
	// The newest run ran: it has a result and a task summary.
	s := spec("ran", 1, 200_000)
	s.Goal = big
	started, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	watchAll(t, n.client, started.GetRunId())

	seen := map[string]bool{}
	token := ""
	for page := 0; ; page++ {
		resp, err := n.client.ListRuns(t.Context(), &fanoutv1.ListRunsRequest{TenantId: "t1", PageSize: 500, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		if got := len(resp.GetRuns()); got > 100 || got == 0 {
			t.Fatalf("page %d has %d runs, want 1..100", page, got)
		}
		if size := proto.Size(resp); size > 64<<10 {
			t.Errorf("page %d is %d bytes encoded: summaries of %d runs should be far smaller", page, size, len(resp.GetRuns()))
		}
		for _, r := range resp.GetRuns() {
			seen[r.GetRunId()] = true
			if r.GetSpec() != nil || r.GetResult() != nil {
				t.Errorf("ListRuns returned run %s with its spec (%v) or result (%v)", r.GetRunId(), r.GetSpec() != nil, r.GetResult() != nil)
			}
			if len(r.GetTasks()) != 1 || r.GetTasks()[0].GetSummary() != nil {
				t.Errorf("run %s: tasks %v, want one without its summary", r.GetRunId(), r.GetTasks())
			}
		}
		if r := resp.GetRuns()[0]; page == 0 {
			if r.GetRunId() != started.GetRunId() || r.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED ||
				r.GetBudget().GetLimitTokens() != 200_000 || r.GetBudget().GetSpentTokens() == 0 ||
				r.GetTasks()[0].GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
				t.Errorf("newest summary %v, want the run that ran, SUCCEEDED, with its budget and task status", r)
			}
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
		if page > 3 {
			t.Fatal("too many pages")
		}
	}
	if len(seen) != stored+1 {
		t.Errorf("listed %d runs, want %d", len(seen), stored+1)
	}

	got, err := n.client.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: started.GetRunId()})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetRun().GetSpec().GetGoal() != big || got.GetRun().GetResult() == nil || got.GetRun().GetTasks()[0].GetSummary() == nil {
		t.Errorf("GetRun: goal of %d bytes, result %v, task summary %v: want the whole run",
			len(got.GetRun().GetSpec().GetGoal()), got.GetRun().GetResult() != nil, got.GetRun().GetTasks()[0].GetSummary() != nil)
	}
}
