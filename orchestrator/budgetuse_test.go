package orchestrator_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/llm"
)

// demoSim is the sim model as `make demo` runs it (fanout dev's defaults),
// faster: the forecast rests on tokens, not on time.
var demoSim = llm.SimConfig{Latency: 150 * time.Millisecond, ToolCallsPerIteration: 2, FinishAfter: 3, OutputTokens: 300, Seed: 1}

// demoWorkers starts the demo's three workers (its sim model, 64 slots
// each) and returns their addresses.
func (b *testBundle) demoWorkers(t testing.TB) []string {
	t.Helper()
	var workers []string
	for i := range 3 {
		w, _ := b.worker(t, fmt.Sprintf("worker-%d", i+1), demoSim, 64)
		workers = append(workers, w)
	}
	return workers
}

// demoSpec is the spec `make demo` runs (examples/research.json), with
// budget limit and admission policy.
func demoSpec(t *testing.T, key string, limit int64, admission fanoutv1.AdmissionPolicy) *fanoutv1.RunSpec {
	t.Helper()
	raw, err := os.ReadFile("../examples/research.json")
	if err != nil {
		t.Fatal(err)
	}
	var req fanoutv1.StartRunRequest
	if err := protojson.Unmarshal(raw, &req); err != nil {
		t.Fatalf("examples/research.json: %v", err)
	}
	s := req.GetSpec()
	s.IdempotencyKey = key
	s.Budget.LimitTokens = limit
	s.Budget.Admission = admission
	return s
}

// budgetUse is how a run spent its budget.
type budgetUse struct {
	state                         fanoutv1.RunState
	succeeded, woundDown, started int
	notStarted                    int
	startedWithoutIteration       int
	facts                         int
	spent, estimated              int64
	synthesis                     bool
	took                          time.Duration
	outcomes                      []*fanoutv1.TaskOutcome
}

func (u budgetUse) estimatedShare() float64 {
	if u.spent == 0 {
		return 0
	}
	return float64(u.estimated) / float64(u.spent)
}

// runDemoSpec runs the demo's spec at limit under admission on three
// workers, as `make demo` does, and says how it spent its budget.
func runDemoSpec(t *testing.T, limit int64, admission fanoutv1.AdmissionPolicy) budgetUse {
	t.Helper()
	b := setup(t)
	workers := b.demoWorkers(t)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, workers...)
	s := demoSpec(t, fmt.Sprintf("demo-%d-%s", limit, admission), limit, admission)
	start := time.Now()
	evs := runStream(t, n.client, s)
	fin := checkEvents(t, evs)
	u := budgetUse{state: fin.GetState(), took: time.Since(start), facts: len(fin.GetResult().GetFacts()),
		synthesis: fin.GetResult().GetSynthesis() != "", outcomes: fin.GetResult().GetTasks()}
	for _, o := range u.outcomes {
		switch {
		case o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED:
			u.notStarted++
			continue
		case o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED && o.GetSummary().GetWoundDown():
			u.woundDown++
		case o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED:
			u.succeeded++
		}
		if o.GetStartedAt() != nil {
			u.started++
			if o.GetSummary().GetIterations() == 0 {
				u.startedWithoutIteration++
			}
		}
	}
	if err := b.pool.QueryRow(t.Context(), `SELECT coalesce(sum(spent), 0), coalesce(sum(spent) FILTER (WHERE estimated), 0)
		FROM reservation WHERE run_id = $1`, evs[0].GetRunId()).Scan(&u.spent, &u.estimated); err != nil {
		t.Fatal(err)
	}
	return u
}

// TestDemoSpecSpendsItsBudgetWell: the demo's spec and budget (8 tasks, 4
// at a time, 12,000 tokens, synthesis), as `make demo` runs it. Greedy,
// it started every task it had a slot for and the budget cut them off in
// flight: half its spend bought calls thrown away, and the tasks it never
// started looked cut off too. By forecast (the default) the run still
// meets its budget (BUDGET_EXHAUSTED) but at most 10% of what it spent was
// cut off in flight, every task it started ran, those it did not start say
// why, and it ends with its synthesis.
func TestDemoSpecSpendsItsBudgetWell(t *testing.T) {
	t.Parallel()
	u := runDemoSpec(t, 12_000, fanoutv1.AdmissionPolicy_ADMISSION_POLICY_UNSPECIFIED)
	t.Logf("%+v", u)
	if u.state != fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED {
		t.Errorf("run ended %s; want BUDGET_EXHAUSTED: the budget does not pay for every task", u.state)
	}
	if share := u.estimatedShare(); share > 0.10 {
		t.Errorf("%d of %d tokens spent (%.0f%%) were calls cut off in flight, billed at their reservation; want at most 10%%",
			u.estimated, u.spent, 100*share)
	}
	if u.startedWithoutIteration > 0 {
		t.Errorf("%d started tasks ran no iteration", u.startedWithoutIteration)
	}
	if u.notStarted == 0 || u.succeeded+u.woundDown == 0 {
		t.Errorf("%d tasks answered, %d not started; want some of each", u.succeeded+u.woundDown, u.notStarted)
	}
	for _, o := range u.outcomes {
		if o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED &&
			(!strings.Contains(o.GetSummary().GetError(), "not started") || o.GetForecastTokens() <= 0) {
			t.Errorf("task %s NOT_STARTED with error %q and forecast %d; want it to say why, with its forecast",
				o.GetTaskId(), o.GetSummary().GetError(), o.GetForecastTokens())
		}
		if o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_BUDGET_EXHAUSTED && o.GetStartedAt() == nil {
			t.Errorf("task %s never started but ended BUDGET_EXHAUSTED, like a task the budget cut off", o.GetTaskId())
		}
	}
	if !u.synthesis {
		t.Error("no synthesis: a run that meets its budget must still end with an answer")
	}
	// docs/budget.md#starting-a-task-with-less-than-its-forecast: what the
	// three whole tasks leave pays for a fourth's useful iteration and
	// answer, not for its forecast: it runs wound down from the start.
	var short int
	for _, o := range u.outcomes {
		if s := o.GetSummary(); s.GetWoundDown() && s.GetIterations() == 2 && o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			short++
		}
	}
	if short == 0 {
		t.Error("no task ran wound down from the start (one useful iteration, then its answer)")
	}
}

// TestBudgetUseComparison compares the two admission policies on the
// demo's spec: at its budget in `make test`, and at 6k, 12k, 24k and 48k
// with FANOUT_BUDGET_COMPARE=1 (`make budget-compare`), printing the
// table. Whatever the budget, forecast never cuts off more than greedy.
func TestBudgetUseComparison(t *testing.T) {
	t.Parallel()
	budgets := []int64{12_000}
	if os.Getenv("FANOUT_BUDGET_COMPARE") != "" {
		budgets = []int64{6_000, 12_000, 24_000, 48_000}
	}
	var rows []string
	for _, limit := range budgets {
		uses := map[fanoutv1.AdmissionPolicy]budgetUse{}
		for _, policy := range []fanoutv1.AdmissionPolicy{fanoutv1.AdmissionPolicy_ADMISSION_POLICY_GREEDY,
			fanoutv1.AdmissionPolicy_ADMISSION_POLICY_FORECAST} {
			u := runDemoSpec(t, limit, policy)
			uses[policy] = u
			perFact := "-"
			if u.facts > 0 {
				perFact = fmt.Sprint(u.spent / int64(u.facts))
			}
			rows = append(rows, fmt.Sprintf("| %d | %s | %d | %d | %d | %d | %d of %d (%.0f%%) | %d (%.1f%%) | %v | %s | %s | %.1fs |",
				limit, strings.TrimPrefix(policy.String(), "ADMISSION_POLICY_"), u.succeeded, u.woundDown, u.notStarted,
				u.facts, u.estimated, u.spent, 100*u.estimatedShare(), u.spent, 100*float64(u.spent)/float64(limit), u.synthesis, perFact,
				strings.TrimPrefix(u.state.String(), "RUN_STATE_"), u.took.Seconds()))
		}
		g, f := uses[fanoutv1.AdmissionPolicy_ADMISSION_POLICY_GREEDY], uses[fanoutv1.AdmissionPolicy_ADMISSION_POLICY_FORECAST]
		if f.estimated > g.estimated {
			t.Errorf("budget %d: forecast cut off %d tokens in flight, greedy %d", limit, f.estimated, g.estimated)
		}
	}
	t.Logf("\n| budget | admission | succeeded | wound down | not started | facts | estimated (cut off) | budget used | synthesis | tokens per fact | run | took |\n"+
		"|---|---|---|---|---|---|---|---|---|---|---|---|\n%s", strings.Join(rows, "\n"))
}
