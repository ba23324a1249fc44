package orchestrator_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/llm"
)

// TestCancelAfterExhaustionUnderDrain: a run exhausted under DRAIN lets its
// calls in flight finish, but a CancelRun after that still stops them and
// the run ends CANCELLED with the caller's cause. The cancel is sent to
// another replica, so the driving one hears it only through the ledger's
// second signal; its CancelGrace is longer than the test allows, so the
// tasks end promptly only if their worker hears the cancel too.
func TestCancelAfterExhaustionUnderDrain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const latency = 30 * time.Second
	w, sim := b.worker(t, "slow", llm.SimConfig{Latency: latency}, 8)
	a := b.orchestrator(t, "a", orchestrator.Config{CancelGrace: 25 * time.Second}, w)
	other := b.orchestrator(t, "b", orchestrator.Config{}, w)

	s := spec("drain-then-cancel", 2, 10_000)
	s.Budget.MinReservationTokens = 1_000
	s.OnExhaustion = fanoutv1.ExhaustionPolicy_EXHAUSTION_POLICY_DRAIN
	s.Limits = &fanoutv1.Limits{MaxConcurrency: 2}
	for _, task := range s.Tasks {
		task.TokenBudget = 5_000
	}
	start, err := a.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := start.GetRunId()
	ctx, cancel := context.WithTimeout(t.Context(), 2*latency)
	defer cancel()
	stream, err := other.client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}

	// Both calls in flight, another spender takes the rest of the run's
	// budget (a reservation on the run account, as synthesis makes) and
	// gives it back: the run is exhausted, and DRAIN lets both calls run on.
	deadline := time.Now().Add(patience)
	for len(sim.Calls()) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 2 model calls started within %v", len(sim.Calls()), patience)
		}
		time.Sleep(10 * time.Millisecond) // polling the sim's call log
	}
	exhaust(t, b, runID, s.GetTenantId())

	var evs []*fanoutv1.RunEvent
	var cancelledAt time.Time
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("watch run: %v (after %d events)", err, len(evs))
		}
		evs = append(evs, msg.GetEvent())
		if msg.GetEvent().GetBudgetExhausted() != nil && cancelledAt.IsZero() {
			cancelledAt = time.Now()
			if _, err := other.client.CancelRun(t.Context(), &fanoutv1.CancelRunRequest{RunId: runID, Reason: "stop"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if cancelledAt.IsZero() {
		t.Fatalf("the run ended without a BudgetExhausted event (%d events)", len(evs))
	}
	took := time.Since(cancelledAt)
	fin := checkEvents(t, evs)
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_CANCELLED || fin.GetCancelCause() != "cancelled by caller: stop" {
		t.Errorf("run ended %s (%q), want CANCELLED with the caller's cause", fin.GetState(), fin.GetCancelCause())
	}
	if took > latency/3 {
		t.Errorf("the run ended %v after the cancel: its calls in flight were not stopped (sim latency %v)", took, latency)
	}
	for _, c := range sim.Calls() {
		if !c.Cancelled {
			t.Errorf("model call of task %s (iteration %d) was not cancelled", c.TaskID, c.Iteration)
		}
	}
	got, err := other.client.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range got.GetRun().GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_CANCELLED || o.GetSummary().GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_CANCELLED {
			t.Errorf("task %s ended %s with summary %v; want CANCELLED, told by its worker", o.GetTaskId(), o.GetStatus(), o.GetSummary())
		}
	}
	b.checkLedger(t)
}

// exhaust exhausts a run from outside its tasks: a reservation of all that
// is available on the run account and unused in its tasks' budget slices
// (which the reserve recalls), voided at once.
func exhaust(t *testing.T, b *testBundle, runID, tenantID string) {
	t.Helper()
	acct, err := b.ledger.RunAccount(t.Context(), runID)
	if err != nil {
		t.Fatal(err)
	}
	attempt, err := b.ledger.BeginAttempt(t.Context(), acct.ID, runID, tenantID)
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.ledger.Reserve(t.Context(), budget.ReserveParams{Account: acct.ID, RunID: runID, TenantID: tenantID,
		Attempt: attempt.N, Secret: attempt.Secret, Want: acct.Available() + acct.Sliced, Min: 1, Holder: "test", TTL: time.Minute})
	if err != nil {
		t.Fatalf("reserve the rest of run %s: %v", runID, err)
	}
	if _, err := b.ledger.Void(t.Context(), res.ID, res.Lease.Generation, ""); err != nil {
		t.Fatal(err)
	}
	if acct, err := b.ledger.RunAccount(t.Context(), runID); err != nil || acct.State != budget.StateExhausted {
		t.Fatalf("run account after the reservation: %+v, %v; want exhausted", acct, err)
	}
}
