package main

// A run outlives the orchestrator process that drives it: kill -9 it, and
// another replica adopts the run and drives it to its end (docs/operations.md#failure-modes-and-what-happens).

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store/storetest"
)

// leaseFlags make a fleet's leases short, so that a lost replica's runs are
// adopted within seconds.
var leaseFlags = []string{"--heartbeat-interval", "200ms", "--orphan-after", "2s",
	"--poll-interval", e2ePoll, "--sweep-interval", e2eSweep, "--metrics-listen", "127.0.0.1:0"}

// TestKilledOrchestratorRunIsResumed: the orchestrator process driving a
// 30-task run is killed (SIGKILL) with a few tasks done and others running.
// A second replica adopts the run once its lease lapses and drives it on:
// the run SUCCEEDS with all 30 tasks, each task has exactly one final
// outcome, no two attempts of a task held reservations at the same time
// (read from the reservation rows), and the ledger is conserved. The time
// from the kill to the adoption and to the first task dispatched again is
// logged (the "time to resume").
func TestKilledOrchestratorRunIsResumed(t *testing.T) {
	t.Parallel()
	url := storetest.NewDB(t)
	pool := openPool(t, url)
	workers := []*workerProc{
		startWorkerProc(t, url, "w1", rollingSim...),
		startWorkerProc(t, url, "w2", rollingSim...),
	}
	doomed := startOrchestratorProc(t, url, "orch-a", workers, leaseFlags...)
	adopter := startOrchestratorMain(t, url, workers, append([]string{"--name", "orch-b"}, leaseFlags...)...)

	s := e2eSpec("killed-orchestrator", 30, 10_000_000)
	s.Limits.MaxConcurrency = 4
	started, err := dial(t, doomed.addr).StartRun(context.Background(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := started.GetRunId()
	waitFor(t, 30*time.Second, "a fifth of the run's tasks done", func() (bool, string) {
		n := tasksIn(t, pool, runID, "SUCCEEDED")
		return n >= 6, strconv.Itoa(n) + " succeeded"
	})
	doomed.kill(t)
	killed := time.Now()
	if done := tasksIn(t, pool, runID, "SUCCEEDED"); done >= len(s.GetTasks())-4 {
		t.Fatalf("%d of %d tasks were done at the kill: the run does not span it", done, len(s.GetTasks()))
	}

	var mu sync.Mutex
	var adoptedAt, resumedAt time.Time
	evs := watchAll(t, adopter.client, runID, func(ev *fanoutv1.RunEvent) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case ev.GetRunAdopted() != nil:
			adoptedAt = time.Now()
		case ev.GetTaskStarted() != nil && !adoptedAt.IsZero() && resumedAt.IsZero():
			resumedAt = time.Now()
		}
	})
	mu.Lock()
	t.Logf("after the kill: adopted in %v (orphan-after 2s), first task running again in %v, run ended in %v",
		adoptedAt.Sub(killed).Round(time.Millisecond), resumedAt.Sub(killed).Round(time.Millisecond),
		time.Since(killed).Round(time.Millisecond))
	mu.Unlock()

	fin := evs[len(evs)-1].GetRunFinished()
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Errorf("run ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	checkOutcomes(t, s, fin.GetResult().GetTasks())
	for _, o := range fin.GetResult().GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			t.Errorf("task %s ended %s: %s", o.GetTaskId(), o.GetStatus(), o.GetSummary().GetError())
		}
	}
	finished := map[string]int{}
	var adoptions []*fanoutv1.RunAdopted
	for _, ev := range evs {
		if f := ev.GetTaskFinished(); f != nil {
			finished[f.GetOutcome().GetTaskId()]++
		}
		if a := ev.GetRunAdopted(); a != nil {
			adoptions = append(adoptions, a)
		}
	}
	for _, task := range s.GetTasks() {
		if n := finished[task.GetId()]; n != 1 {
			t.Errorf("task %s has %d TaskFinished events, want exactly 1", task.GetId(), n)
		}
	}
	if len(adoptions) != 1 || adoptions[0].GetPreviousOwner() != "orch-a" || adoptions[0].GetOwner() != "orch-b" {
		t.Errorf("RunAdopted events %v, want one, from orch-a to orch-b", adoptions)
	}
	waitClosed(t, pool, runID)
	checkConserved(t, pool, runID)
	t.Logf("reservations of %d (account, attempt) pairs",
		storetest.CheckAttemptsApart(t, pool, runID))
}

// startOrchestratorProc starts `fanout orchestrator` as a child process
// named name (its run owner name), so that it can be killed.
func startOrchestratorProc(t testing.TB, databaseURL, name string, workers []*workerProc, extra ...string) *workerProc {
	t.Helper()
	args := orchestratorArgs(t, databaseURL, workers, append([]string{"--name", name, "--shutdown-grace", "10s"}, extra...)...)
	return startChild(t, name, "orchestrator serving", nil, args)
}
