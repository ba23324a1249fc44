package orchestrator_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/subagent/llm"
)

// beatlessChildStore is beatlessStore that keeps the store's ChildCalls.
type beatlessChildStore struct {
	beatlessStore
}

func (s beatlessChildStore) cc() orchestrator.ChildCalls { return s.RunStore.(orchestrator.ChildCalls) }
func (s beatlessChildStore) ChildLink(ctx context.Context, runID string) (runs.ChildLink, error) {
	return s.cc().ChildLink(ctx, runID)
}
func (s beatlessChildStore) FanOutCall(ctx context.Context, runID, taskID, key string) (bool, bool, error) {
	return s.cc().FanOutCall(ctx, runID, taskID, key)
}
func (s beatlessChildStore) AnswerCall(ctx context.Context, runID, taskID, key, answer, refusal string) error {
	return s.cc().AnswerCall(ctx, runID, taskID, key, answer, refusal)
}
func (s beatlessChildStore) RunningChildren(ctx context.Context, runID, taskID string) ([]string, error) {
	return s.cc().RunningChildren(ctx, runID, taskID)
}

// TestALostOwnerLeavesTheChildrenToTheAdopter: an orchestrator that lost
// a run to another (its heartbeat lapsed; the other adopted the run and
// drives its tasks on) unwinds its own drivers' tasks without cancelling
// their children: the new owner's attempt of the task joins the same
// child, whose work is not lost to the change of hands. (A second
// reviewer's test: it failed with the child CANCELLED, "its parent task
// ended CANCELLED".)
func TestALostOwnerLeavesTheChildrenToTheAdopter(t *testing.T) {
	// Not parallel: trees of runs on workers with sims that take their
	// time; beside the package's timing-sensitive tests they starved them.
	b := setup(t)
	sim := llm.SimConfig{Latency: 200 * time.Millisecond, ToolCallsPerIteration: 1, FinishAfter: 30}
	w, _ := b.worker(t, "w1", sim, 16)
	var paused atomic.Bool
	a := b.orchestratorWith(t, "a", leaseConfig(), func(p *orchestrator.EngineParams) {
		p.Store = beatlessChildStore{beatlessStore{RunStore: p.Store, off: &paused}}
	}, w)
	other := b.orchestrator(t, "b", leaseConfig(), w)

	s := spec("lost-owner", 1, 1_000_000)
	s.FanOut = &fanoutv1.FanOut{MaxDepth: 1}
	s.Tasks[0].TokenBudget = 1_000_000
	s.Tasks[0].Instruction = "study fan out(part a | part b)"
	s.Tasks[0].AllowedTools = []string{"search"}
	start, err := a.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	root := start.GetRunId()
	var child string
	for deadline := time.Now().Add(patience); child == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		_ = b.pool.QueryRow(t.Context(), `SELECT run_id FROM run WHERE parent_run_id = $1`, root).Scan(&child) // polling the table
	}
	if child == "" {
		t.Fatal("no child run")
	}
	paused.Store(true)
	waitOwner(t, b, root, "b")
	paused.Store(false) // a's heartbeat finds the run taken
	evs := watchAll(t, other.client, root)
	fin := evs[len(evs)-1].GetRunFinished()
	got, err := other.client.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: child})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("root %s; child %s (%q); task: %v", fin.GetState(), got.GetRun().GetState(), got.GetRun().GetCancelCause(),
		fin.GetResult().GetTasks()[0].GetStatus())
	if strings.Contains(got.GetRun().GetCancelCause(), "parent task ended") {
		t.Errorf("the child was cancelled by the orchestrator that lost its parent run (%q), though the parent's task went on under b",
			got.GetRun().GetCancelCause())
	}
}
