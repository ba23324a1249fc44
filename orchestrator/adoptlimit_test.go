package orchestrator_test

import (
	"testing"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// TestThirdAdoptionIsResumed is the lower side of the adoption limit
// (docs/runs.md "Lost orchestrators": a run adopted more than 3 times ends
// FAILED): a run that changed hands twice already is still resumed by its
// third adopter and ends SUCCEEDED, its RunAdopted counting 3.
// TestRunAdoptedTooOftenEnds is the upper side (the 4th ends it).
func TestThirdAdoptionIsResumed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Calls of 1 s: the tasks are still running (two calls each) when the
	// test sees them, also on a loaded machine.
	slow := resumeSim
	slow.Latency = time.Second
	w, _ := b.worker(t, "w", slow, 8)
	a, kill := b.killableOrchestrator(t, "a", w)
	s := spec("third", 2, 100_000)
	start, err := a.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := start.GetRunId()
	awaitTasksIn(t, a.client, runID, fanoutv1.TaskStatus_TASK_STATUS_RUNNING, 2)
	if _, err := b.pool.Exec(t.Context(), `UPDATE run SET adoptions = 2 WHERE run_id = $1`, runID); err != nil {
		t.Fatal(err)
	}
	kill()
	other := b.orchestrator(t, "b", leaseConfig(), w)
	evs := watchAll(t, other.client, runID)
	fin := checkEvents(t, evs)
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Errorf("run adopted a third time ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	var adopted []*fanoutv1.RunAdopted
	for _, ev := range evs {
		if a := ev.GetRunAdopted(); a != nil {
			adopted = append(adopted, a)
		}
	}
	if len(adopted) != 1 || adopted[0].GetAdoptions() != 3 || adopted[0].GetOwner() != "b" || len(adopted[0].GetResumedTaskIds()) == 0 {
		t.Errorf("RunAdopted events %v; want one, the third adoption, by b, resuming the unfinished tasks", adopted)
	}
	run := checkEndedOnce(t, b, other.client, s, runID, evs)
	for _, o := range run.GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			t.Errorf("task %s ended %s (%q), want SUCCEEDED", o.GetTaskId(), o.GetStatus(), o.GetSummary().GetError())
		}
	}
}
