package orchestrator_test

import (
	"context"
	"testing"
	"time"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/llm"
)

// stalledStarts is a run store whose StartTask waits until its context
// ends and fails with its error, writing nothing: a database so slow that
// every start runs out of time (issue 44, 100 runs of 100 tasks).
type stalledStarts struct{ orchestrator.RunStore }

func (stalledStarts) StartTask(ctx context.Context, _, _ string, _ *fanoutv1.TaskStarted) (*fanoutv1.TaskOutcome, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestStartThatRanOutOfTimeStillTells: a task whose StartTask ran out of
// time runs on, and its run's history still holds its TaskStarted, once:
// the event appended instead is not given the context the start used up.
func TestStartThatRanOutOfTimeStillTells(t *testing.T) {
	orchestrator.SetStartTimeout(t, 200*time.Millisecond)
	b := setup(t)
	w, _ := b.worker(t, "w", llm.SimConfig{Latency: 50 * time.Millisecond}, 8)
	n := b.orchestratorWith(t, "o1", orchestrator.Config{}, func(p *orchestrator.EngineParams) {
		p.Store = stalledStarts{RunStore: p.Store}
	}, w)
	evs := runStream(t, n.client, spec("slow-starts", 3, 1_000_000))
	fin := checkEvents(t, evs)
	started := map[string]int{}
	for _, ev := range evs {
		if s := ev.GetTaskStarted(); s != nil {
			started[s.GetTaskId()]++
		}
	}
	for _, o := range fin.GetResult().GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED || started[o.GetTaskId()] != 1 {
			t.Errorf("task %s ended %s with %d TaskStarted events; want SUCCEEDED with 1",
				o.GetTaskId(), o.GetStatus(), started[o.GetTaskId()])
		}
	}
}
