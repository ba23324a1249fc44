package main

import (
	"bytes"
	"context"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store/storetest"
)

// TestKilledOrchestratorDuringContinuation (docs/budget.md#continue): a
// run ends BUDGET_EXHAUSTED with tasks NOT_STARTED; it is continued
// through the orchestrator process that then drives it, and that process
// is killed (SIGKILL) with the continuation's first tasks done. Another
// replica adopts the reopened run and drives it to SUCCEEDED: every task
// SUCCEEDED once, none ran twice, the ledger is conserved.
func TestKilledOrchestratorDuringContinuation(t *testing.T) {
	t.Parallel()
	url := storetest.NewDB(t)
	pool := openPool(t, url)
	workers := []*workerProc{startWorkerProc(t, url, "w1", rollingSim...)}
	doomed := startOrchestratorProc(t, url, "orch-a", workers, leaseFlags...)
	adopter := startOrchestratorMain(t, url, workers, append([]string{"--name", "orch-b"}, leaseFlags...)...)

	s := e2eSpec("continued-killed", 12, 4_000)
	s.Budget.Admission = fanoutv1.AdmissionPolicy_ADMISSION_POLICY_FORECAST
	s.Limits.MaxConcurrency = 2
	started, err := dial(t, doomed.addr).StartRun(context.Background(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := started.GetRunId()
	evs := watchAll(t, adopter.client, runID, nil)
	if fin := evs[len(evs)-1].GetRunFinished(); fin.GetState() != fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED {
		t.Fatalf("run ended %s (%q), want BUDGET_EXHAUSTED", fin.GetState(), fin.GetCancelCause())
	}
	before := tasksIn(t, pool, runID, "SUCCEEDED")
	if n := tasksIn(t, pool, runID, "NOT_STARTED"); n < 6 {
		t.Fatalf("%d tasks NOT_STARTED at the first end, want at least 6 to continue", n)
	}
	// Through the CLI: first its quote (nothing written), then the
	// continuation.
	cli := func(args ...string) []byte {
		t.Helper()
		var out, errOut bytes.Buffer
		if code := Main(context.Background(), append(args, "--addr", doomed.addr, "--tenant", "e2e", "--json"), &out, &errOut,
			func(string) string { return "" }); code != 0 {
			t.Fatalf("fanout %v exited %d: %s", args, code, errOut.String())
		}
		return out.Bytes()
	}
	var quoted, res fanoutv1.ContinueRunResponse
	if err := protojson.Unmarshal(cli("continue", runID, "--add", "1000000", "--quote"), &quoted); err != nil {
		t.Fatal(err)
	}
	if n := len(quoted.GetQuote().GetTasks()); n != len(s.GetTasks()) || quoted.GetContinuation() != nil ||
		quoted.GetQuote().GetLimitTokens() != 1_004_000 {
		t.Errorf("fanout continue --quote: %d task lines, continuation %v, limit %d; want %d lines, no continuation, limit 1004000",
			n, quoted.GetContinuation(), quoted.GetQuote().GetLimitTokens(), len(s.GetTasks()))
	}
	if err := protojson.Unmarshal(cli("continue", runID, "--add", "1000000", "--key", "more", "--reason", "finish it"), &res); err != nil {
		t.Fatal(err)
	}
	if !res.GetContinuation().GetReopened() || res.GetContinuation().GetReason() != "finish it" {
		t.Fatalf("continuation %v did not reopen the run", res.GetContinuation())
	}
	waitFor(t, 30*time.Second, "two tasks of the continuation done", func() (bool, string) {
		n := tasksIn(t, pool, runID, "SUCCEEDED")
		return n >= before+2, strconv.Itoa(n) + " succeeded"
	})
	doomed.kill(t)
	if done := tasksIn(t, pool, runID, "SUCCEEDED"); done >= len(s.GetTasks())-2 {
		t.Fatalf("%d of %d tasks were done at the kill: the continuation does not span it", done, len(s.GetTasks()))
	}

	evs = watchAll(t, adopter.client, runID, nil)
	fin := evs[len(evs)-1].GetRunFinished()
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("the continued run ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	succeeded, ends, adopted := map[string]int{}, 0, 0
	for _, ev := range evs {
		switch {
		case ev.GetTaskFinished().GetOutcome().GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED:
			succeeded[ev.GetTaskFinished().GetOutcome().GetTaskId()]++
		case ev.GetRunFinished() != nil:
			ends++
		case ev.GetRunAdopted() != nil:
			adopted++
		}
	}
	for _, task := range s.GetTasks() {
		if n := succeeded[task.GetId()]; n != 1 {
			t.Errorf("task %s SUCCEEDED %d times, want once", task.GetId(), n)
		}
	}
	if ends != 2 || adopted != 1 {
		t.Errorf("%d RunFinished and %d RunAdopted events, want 2 ends and one adoption", ends, adopted)
	}
	waitClosed(t, pool, runID)
	checkConserved(t, pool, runID)
	storetest.CheckAttemptsApart(t, pool, runID)
}
