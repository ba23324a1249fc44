package orchestrator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	fanoutnode "github.com/fanout/fanout/node"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// TestTaskWithoutWorkerFailsAtItsDeadline: with no worker listening at all,
// a task waits for one until its deadline — not a few quick tries — and
// then fails saying that no worker took it before its deadline, with the
// last error seen.
func TestTaskWithoutWorkerFailsAtItsDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := b.orchestrator(t, "o1", orchestrator.Config{RetryBackoff: time.Millisecond}, "127.0.0.1:1")

	const deadline = 1500 * time.Millisecond
	s := spec("no-worker", 1, 1_000_000)
	s.Tasks[0].Timeout = durationpb.New(deadline)
	began := time.Now()
	fin := checkEvents(t, runStream(t, n.client, s))
	took := time.Since(began)
	checkDispatchOrder(t, s, fin.GetResult().GetTasks())
	o := fin.GetResult().GetTasks()[0]
	if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_FAILED {
		t.Errorf("task ended %s (%q), want FAILED", o.GetStatus(), o.GetSummary().GetError())
	}
	if msg := o.GetSummary().GetError(); !strings.Contains(msg, "no worker took the task before its deadline") ||
		!strings.Contains(msg, "last error") {
		t.Errorf("task's error %q: want it to say that no worker took the task before its deadline, and the last error", msg)
	}
	if took < deadline {
		t.Errorf("the task ended %v after the run began, before its %v deadline: it did not wait for a worker", took, deadline)
	}
	b.checkLedger(t)
}

// TestTaskWaitsForAWorkerThatComesUp: the orchestrator starts while nothing
// listens at its worker's address (its channel backs off), a run is
// submitted, and the worker starts on that address a moment later: every
// task waits for it and succeeds.
func TestTaskWaitsForAWorkerThatComesUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	addr := storetest.FreeAddr(t)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, addr)

	s := spec("worker-comes-up", 4, 1_000_000)
	type result struct{ evs []*fanoutv1.RunEvent }
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), patience)
		defer cancel()
		stream, err := n.client.Run(ctx, &fanoutv1.RunRequest{Spec: s})
		var evs []*fanoutv1.RunEvent
		for err == nil {
			var msg *fanoutv1.RunResponse
			if msg, err = stream.Recv(); err == nil {
				evs = append(evs, msg.GetEvent())
			}
		}
		done <- result{evs}
	}()

	time.Sleep(700 * time.Millisecond) // the scenario: the worker comes up later
	_, wt := trust(t)
	w, err := fanoutnode.OpenWorker(t.Context(), b.backend, fanoutnode.WorkerConfig{Listen: addr, Trust: wt,
		Server: subagent.ServerConfig{Name: "late"}, Sim: llm.SimConfig{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = w.Close(ctx)
	})

	var r result
	select {
	case r = <-done:
	case <-time.After(patience):
		t.Fatalf("the run did not end within %v", patience)
	}
	fin := checkEvents(t, r.evs)
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Errorf("run ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	checkDispatchOrder(t, s, fin.GetResult().GetTasks())
	for _, o := range fin.GetResult().GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			t.Errorf("task %s ended %s: %s", o.GetTaskId(), o.GetStatus(), o.GetSummary().GetError())
		}
	}
	b.checkLedger(t)
}
