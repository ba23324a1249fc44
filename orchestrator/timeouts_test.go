package orchestrator_test

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/llm"
)

// liveTimeoutMargin is how late past its timeout a running task or run may
// end on a loaded machine: the cancellation reaches the worker, its call
// is settled, the outcome is written.
const liveTimeoutMargin = time.Second

// TestLiveTimeouts: a task or a run whose subagents are inside a model
// call that does not return ends TIMED_OUT at its timeout (docs/runs.md "The
// spec": a task's `timeout`, `limits.runTimeout`), measured with the
// server's own timestamps — never before it, and at most
// liveTimeoutMargin after it.
func TestLiveTimeouts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w", llm.SimConfig{Latency: time.Hour}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w)

	t.Run("task", func(t *testing.T) {
		const timeout = 1500 * time.Millisecond
		s := spec("task-timeout", 2, 1_000_000)
		s.Tasks[0].Timeout = durationpb.New(timeout)
		s.Tasks[1].Timeout = durationpb.New(2 * timeout)
		evs := runStream(t, n.client, s)
		fin := checkEvents(t, evs)
		created := evs[0].GetRunStarted().GetRun().GetCreatedAt().AsTime()
		for i, o := range fin.GetResult().GetTasks() {
			want := time.Duration(i+1) * timeout
			// The timeout counts from the dispatch, which comes after
			// the run was created and before the worker's TaskStarted.
			sinceCreated := o.GetFinishedAt().AsTime().Sub(created)
			sinceStarted := o.GetFinishedAt().AsTime().Sub(o.GetStartedAt().AsTime())
			t.Logf("task %s with timeout %v ended %s %v after it started, %v after the run was created",
				o.GetTaskId(), want, o.GetStatus(), sinceStarted, sinceCreated)
			if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_TIMED_OUT {
				t.Errorf("task %s ended %s (%q); want TIMED_OUT", o.GetTaskId(), o.GetStatus(), o.GetSummary().GetError())
			}
			if sinceCreated < want || sinceStarted > want+liveTimeoutMargin {
				t.Errorf("task %s ended %v after the run was created, %v after it started; want its timeout %v (+%v)",
					o.GetTaskId(), sinceCreated, sinceStarted, want, liveTimeoutMargin)
			}
		}
	})
	t.Run("run", func(t *testing.T) {
		const timeout = 2 * time.Second
		s := spec("run-timeout", 2, 1_000_000)
		s.Limits = &fanoutv1.Limits{RunTimeout: durationpb.New(timeout)}
		evs := runStream(t, n.client, s)
		fin := checkEvents(t, evs)
		if fin.GetState() != fanoutv1.RunState_RUN_STATE_TIMED_OUT {
			t.Errorf("run ended %s (%q); want TIMED_OUT", fin.GetState(), fin.GetCancelCause())
		}
		got, err := n.client.GetRun(tenantCtx(t, "t1"), &fanoutv1.GetRunRequest{RunId: evs[0].GetRunStarted().GetRun().GetRunId()})
		if err != nil {
			t.Fatal(err)
		}
		r := got.GetRun()
		took := r.GetFinishedAt().AsTime().Sub(r.GetCreatedAt().AsTime())
		t.Logf("run with timeout %v ended %s after %v", timeout, r.GetState(), took)
		if took < timeout || took > timeout+liveTimeoutMargin {
			t.Errorf("run ended %v after it was created; want its timeout %v (+%v)", took, timeout, liveTimeoutMargin)
		}
		for _, o := range r.GetTasks() {
			if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_TIMED_OUT && o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_CANCELLED {
				t.Errorf("task %s ended %s; want it stopped by the run's timeout", o.GetTaskId(), o.GetStatus())
			}
		}
	})
	b.checkLedger(t)
}
