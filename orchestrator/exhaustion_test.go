package orchestrator_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent/llm"
)

// The one event that marks a run's exhaustion (docs/budget.md, "When the
// budget ran out"): every path by which a run's budget runs out appends
// exactly one BudgetExhausted, at the moment it ran out, before the
// RunFinished. checkEvents holds every other test's runs to the same.

// oneMark returns the index in evs of the run's one BudgetExhausted,
// failing the test if there is not exactly one or it follows the
// RunFinished.
func oneMark(t *testing.T, evs []*fanoutv1.RunEvent) int {
	t.Helper()
	at := -1
	for i, ev := range evs {
		if ev.GetBudgetExhausted() == nil {
			continue
		}
		if at >= 0 {
			t.Fatalf("BudgetExhausted at events %d and %d; want one", evs[at].GetSequence(), ev.GetSequence())
		}
		at = i
	}
	if at < 0 {
		t.Fatal("no BudgetExhausted event")
	}
	if fin := evs[len(evs)-1]; fin.GetRunFinished() == nil || at >= len(evs)-1 {
		t.Fatalf("BudgetExhausted at event %d of %d, want it before the RunFinished", at+1, len(evs))
	}
	return at
}

// TestLedgerExhaustionIsMarkedOnce: a greedy run whose tasks exhaust its
// ledger account, under each exhaustion policy, has one BudgetExhausted,
// whose budget says exhausted, and ends BUDGET_EXHAUSTED.
func TestLedgerExhaustionIsMarkedOnce(t *testing.T) {
	t.Parallel()
	for _, policy := range []fanoutv1.ExhaustionPolicy{fanoutv1.ExhaustionPolicy_EXHAUSTION_POLICY_CANCEL,
		fanoutv1.ExhaustionPolicy_EXHAUSTION_POLICY_DRAIN} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			sim := llm.SimConfig{Latency: 20 * time.Millisecond, FinishAfter: 3, ToolCallsPerIteration: 1}
			w, _ := b.worker(t, "w", sim, 16)
			n := b.orchestrator(t, "o", orchestrator.Config{}, w)
			s := spec(fmt.Sprintf("ledger-%d", policy), 8, 2_000) // about 800 tokens a task
			s.Budget.MinReservationTokens = 100
			s.OnExhaustion = policy
			s.Limits = &fanoutv1.Limits{MaxConcurrency: 4}
			for _, task := range s.Tasks {
				task.AllowedTools = []string{"search"}
			}
			evs := runStream(t, n.client, s)
			fin := checkEvents(t, evs)
			if fin.GetState() != fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED {
				t.Fatalf("run ended %s (%q), want BUDGET_EXHAUSTED", fin.GetState(), fin.GetCancelCause())
			}
			if m := evs[oneMark(t, evs)].GetBudgetExhausted(); !m.GetBudget().GetExhausted() {
				t.Errorf("BudgetExhausted's budget %v does not say exhausted", m.GetBudget())
			}
		})
	}
}

// TestForecastDeclineIsMarkedOnce: under admission by forecast the run
// declines the tasks its budget cannot pay for (NOT_STARTED) and ends
// BUDGET_EXHAUSTED; its one BudgetExhausted comes when it declined the
// first, before that task's TaskFinished.
func TestForecastDeclineIsMarkedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	workers := b.demoWorkers(t)
	n := b.orchestrator(t, "o", orchestrator.Config{}, workers...)
	evs := runStream(t, n.client, demoSpec(t, "declined", 6_000, fanoutv1.AdmissionPolicy_ADMISSION_POLICY_FORECAST))
	fin := checkEvents(t, evs)
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED {
		t.Fatalf("run ended %s (%q), want BUDGET_EXHAUSTED", fin.GetState(), fin.GetCancelCause())
	}
	mark := oneMark(t, evs)
	declined := -1
	for i, ev := range evs {
		if ev.GetTaskFinished().GetOutcome().GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED {
			declined = i
			break
		}
	}
	if declined < 0 {
		t.Fatal("no task NOT_STARTED: the budget paid for every task")
	}
	if mark > declined {
		t.Errorf("BudgetExhausted is event %d, after the first declined task's TaskFinished (%d): want it when the run declined it",
			evs[mark].GetSequence(), evs[declined].GetSequence())
	}
}

// TestAdoptedExhaustionIsMarkedOnce: a run whose budget ran out under an
// orchestrator that was then lost is adopted. If the lost one had appended
// the run's BudgetExhausted, the adopter appends none; if it had not (it
// died first), the adopter does.
func TestAdoptedExhaustionIsMarkedOnce(t *testing.T) {
	t.Parallel()
	for _, logged := range []bool{true, false} {
		t.Run(fmt.Sprintf("logged=%t", logged), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			runID := fmt.Sprintf("adopted-%t", logged)
			s := spec(runID, 3, 1_000)
			ghost(t, b, runID, s)
			exhaust(t, b, runID, "t1")
			if logged {
				acct, err := b.ledger.RunAccount(t.Context(), runID)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := store.NewRuns(b.pool).AppendEvent(t.Context(), runID, &fanoutv1.RunEvent{
					Event: &fanoutv1.RunEvent_BudgetExhausted{BudgetExhausted: &fanoutv1.BudgetExhausted{
						Budget: &fanoutv1.BudgetSnapshot{LimitTokens: acct.Limit, SpentTokens: acct.Spent, Exhausted: true}}}}); err != nil {
					t.Fatal(err)
				}
			}
			orphan(t, b, runID)
			w, _ := b.worker(t, "w", resumeSim, 8)
			r := b.orchestrator(t, "r", leaseConfig(), w)
			evs := watchAll(t, r.client, runID)
			fin := checkEvents(t, evs)
			if fin.GetState() != fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED {
				t.Fatalf("run ended %s (%q), want BUDGET_EXHAUSTED", fin.GetState(), fin.GetCancelCause())
			}
			mark := oneMark(t, evs)
			adopted := -1
			for i, ev := range evs {
				if ev.GetRunAdopted() != nil {
					adopted = i
				}
			}
			if adopted < 0 {
				t.Fatal("no RunAdopted event: the run was not adopted")
			}
			if logged == (mark > adopted) {
				t.Errorf("BudgetExhausted is event %d, RunAdopted %d; want it the lost owner's (before) iff it had logged it (%t)",
					evs[mark].GetSequence(), evs[adopted].GetSequence(), logged)
			}
		})
	}
}
