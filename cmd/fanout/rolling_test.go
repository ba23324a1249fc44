package main

// Workers that are briefly away — restarted, or not up yet — do not fail
// the tasks that only had to wait for them (docs/operations.md#failure-modes-and-what-happens).

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// rollingSim makes each task short (two iterations and the compression,
// 120 ms a call), so that a run of a few waves spans a worker's restart
// and the stopped worker's drain ends well within the restart's pause.
var rollingSim = []string{"--sim-latency", "120ms", "--sim-tool-calls", "1", "--sim-finish-after", "2",
	"--poll-interval", e2ePoll, "--sweep-interval", e2eSweep}

// TestRollingRestartOfTheOnlyWorker: one worker replica gets SIGTERM in the
// middle of a 24-task run and a new process takes its address 1 s later,
// as a Deployment's rolling restart does. The stopped worker drains what it
// runs and refuses new tasks; those wait for the new process. Every task
// succeeds, and the ledger is conserved with nothing left held.
func TestRollingRestartOfTheOnlyWorker(t *testing.T) {
	t.Parallel()
	url := storetest.NewDB(t)
	pool := openPool(t, url)
	addr := storetest.FreeAddr(t)
	old := startWorkerProc(t, url, "w-old", append([]string{"--listen", addr}, rollingSim...)...)
	orch := startOrchestratorMain(t, url, []*workerProc{old}, "--poll-interval", e2ePoll, "--sweep-interval", e2eSweep)

	s := e2eSpec("rolling-restart", 24, 5_000_000)
	s.Limits.MaxConcurrency = 4
	started, err := orch.client.StartRun(context.Background(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := started.GetRunId()
	waitFor(t, 30*time.Second, "a quarter of the run's tasks done", func() (bool, string) {
		n := tasksIn(t, pool, runID, "SUCCEEDED")
		return n >= 6, strconv.Itoa(n) + " succeeded"
	})
	if err := old.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	if done := tasksIn(t, pool, runID, "SUCCEEDED"); done >= len(s.GetTasks())-4 {
		t.Fatalf("%d of %d tasks were done at the SIGTERM: the run does not span the restart", done, len(s.GetTasks()))
	}
	select {
	case <-old.exited:
	case <-time.After(15 * time.Second):
		t.Fatalf("the stopped worker did not drain and exit within 15s:\n%s", old.logs)
	}
	if pause := time.Second - time.Since(stopped); pause > 0 {
		time.Sleep(pause) // the scenario: the new process starts 1 s after the old one was told to stop
	}
	replacement := startWorkerProc(t, url, "w-new", append([]string{"--listen", addr}, rollingSim...)...)
	t.Logf("the replacement serves %v after the SIGTERM", time.Since(stopped).Round(time.Millisecond))

	evs := watchAll(t, orch.client, runID, nil)
	t.Logf("the run ended %v after the SIGTERM", time.Since(stopped).Round(time.Millisecond))
	fin := evs[len(evs)-1].GetRunFinished()
	checkOutcomes(t, s, fin.GetResult().GetTasks())
	byWorker := map[string]int{}
	for _, o := range fin.GetResult().GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			t.Errorf("task %s ended %s on %q: %s", o.GetTaskId(), o.GetStatus(), o.GetWorker(), o.GetSummary().GetError())
		}
		byWorker[o.GetWorker()]++
	}
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Errorf("run ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	if byWorker[old.name] == 0 || byWorker[replacement.name] == 0 {
		t.Errorf("tasks by worker %v: want some on the stopped worker and the rest on its replacement", byWorker)
	}
	waitClosed(t, pool, runID)
	checkConserved(t, pool, runID)
}

// TestOrchestratorStartedBeforeItsWorker: the orchestrator starts while
// nothing listens at its worker's address, so its channel backs off; the
// worker comes up a second later and a run submitted as soon as it serves
// succeeds: every task waits for the channel to connect instead of failing
// fast while it is in backoff.
func TestOrchestratorStartedBeforeItsWorker(t *testing.T) {
	t.Parallel()
	url := storetest.NewDB(t)
	pool := openPool(t, url)
	addr := storetest.FreeAddr(t)
	orch := startOrchestratorMain(t, url, []*workerProc{{addr: addr}}, "--poll-interval", e2ePoll, "--sweep-interval", e2eSweep)
	time.Sleep(time.Second) // the scenario: the worker comes up after the orchestrator
	startWorkerProc(t, url, "w1", append([]string{"--listen", addr}, rollingSim...)...)

	s := e2eSpec("orchestrator-first", 8, 2_000_000)
	evs := runAll(t, orch.client, s)
	fin := evs[len(evs)-1].GetRunFinished()
	runID := evs[0].GetRunId()
	checkOutcomes(t, s, fin.GetResult().GetTasks())
	for _, o := range fin.GetResult().GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			t.Errorf("task %s ended %s: %s", o.GetTaskId(), o.GetStatus(), o.GetSummary().GetError())
		}
	}
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Errorf("run ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	waitClosed(t, pool, runID)
	checkConserved(t, pool, runID)
}

// tasksIn counts the run's tasks in state st.
func tasksIn(t testing.TB, pool *store.Pool, runID, st string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM task WHERE run_id = $1 AND status = $2`,
		runID, st).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
