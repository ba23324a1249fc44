package orchestrator_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	fanoutnode "github.com/fanout/fanout/node"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// failTaskModel is a worker's sim that fails every call of one task, as a
// provider's error would (not retried, not billed past its reservation).
type failTaskModel struct {
	llm.Model
	task string
}

func (m failTaskModel) Call(ctx context.Context, req llm.Request) (llm.Response, error) {
	if req.Meta.TaskID == m.task {
		return llm.Response{}, errors.New("the provider failed the call (injected by the test)")
	}
	return m.Model.Call(ctx, req)
}

// wrappedWorker starts a subagent worker (package node, as b.worker) with
// sim config cfg, whose model is its sim wrapped by wrap.
func (b *testBundle) wrappedWorker(t *testing.T, name string, cfg llm.SimConfig, wrap func(sim llm.Model) llm.Model) string {
	t.Helper()
	_, wt := trust(t)
	w, err := fanoutnode.OpenWorker(t.Context(), b.backend, fanoutnode.WorkerConfig{Trust: wt, Sim: cfg,
		ModelsFunc: func(_ *fanoutnode.Backend, sim llm.Model) (subagent.ModelFunc, error) {
			return subagent.SimModels(wrap(sim)), nil
		},
		Server: subagent.ServerConfig{Name: name, Capacity: 8}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = w.Close(ctx)
	})
	return w.Addr()
}

// TestForecastCountsOnlyTasksThatRanToAnAnswer: docs/budget.md, "a task's
// forecast: the average peak of the run's tasks that ran to an answer
// (SUCCEEDED or ITERATION_LIMIT)", end to end: a run on a worker with the
// sim model, one task at a time by forecast, whose tasks end, in dispatch
// order, SUCCEEDED; FAILED (its first model call fails, after a grant for a
// 6 KB instruction: the largest peak of the run); BUDGET_EXHAUSTED (its own
// token_budget runs out after calls with tools: cut off); SUCCEEDED; and a
// last task. The two that did not answer made calls and report their peaks
// (FactSummary.iterations and peak_tokens), so only their end status keeps
// them out of the forecast. Each task's forecast at its admission
// (TaskStarted.forecast_tokens) is what the tasks that answered before it
// needed at their peaks, on average (its token_budget before any answered):
// neither the failed task nor the cut-off one moves it.
func TestForecastCountsOnlyTasksThatRanToAnAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Tasks without tools answer in their first call; the one with tools
	// calls them until its budget stops it.
	w := b.wrappedWorker(t, "w", llm.SimConfig{ToolCallsPerIteration: 2, FinishAfter: 1_000},
		func(sim llm.Model) llm.Model { return failTaskModel{Model: sim, task: "fails"} })
	n := b.orchestrator(t, "o", orchestrator.Config{}, w)

	const capTokens = 100_000
	s := &fanoutv1.RunSpec{
		IdempotencyKey: "forecast-inputs",
		TenantId:       "t1",
		Goal:           "find facts",
		Budget:         &fanoutv1.Budget{LimitTokens: 10_000_000, Admission: fanoutv1.AdmissionPolicy_ADMISSION_POLICY_FORECAST},
		Limits:         &fanoutv1.Limits{MaxConcurrency: 1},
		Model:          &fanoutv1.ModelSettings{Provider: "sim", MaxOutputTokens: 64},
		Tasks: []*fanoutv1.TaskSpec{
			{Id: "answers-1", Instruction: "look up item 1", TokenBudget: capTokens},
			{Id: "fails", Instruction: "look up item 2: " + strings.Repeat("in detail ", 600), TokenBudget: capTokens},
			{Id: "cut-off", Instruction: "look up item 3", TokenBudget: 4_000, MaxIterations: 50,
				AllowedTools: []string{"search", "fetch"}},
			{Id: "answers-2", Instruction: "look up item 4, and more of it", TokenBudget: capTokens},
			{Id: "last", Instruction: "look up item 5", TokenBudget: capTokens},
		},
	}
	evs := runStream(t, n.client, s)
	fin := checkEvents(t, evs)

	outcomes := map[string]*fanoutv1.TaskOutcome{}
	for _, o := range fin.GetResult().GetTasks() {
		outcomes[o.GetTaskId()] = o
	}
	want := map[string]fanoutv1.TaskStatus{
		"answers-1": fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED,
		"fails":     fanoutv1.TaskStatus_TASK_STATUS_FAILED,
		"cut-off":   fanoutv1.TaskStatus_TASK_STATUS_BUDGET_EXHAUSTED,
		"answers-2": fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED,
		"last":      fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED,
	}
	for _, task := range s.GetTasks() {
		o := outcomes[task.GetId()]
		t.Logf("%s: %s, %d iterations, spent %d, peak %d, forecast %d", task.GetId(), o.GetStatus(),
			o.GetSummary().GetIterations(), o.GetTokensSpent(), o.GetSummary().GetPeakTokens(), o.GetForecastTokens())
		if o.GetStatus() != want[task.GetId()] {
			t.Fatalf("task %s ended %s (%q), want %s", task.GetId(), o.GetStatus(), o.GetSummary().GetError(), want[task.GetId()])
		}
		if o.GetSummary().GetIterations() < 1 || o.GetSummary().GetPeakTokens() <= 0 {
			t.Fatalf("task %s ran %d iterations with peak %d: every task must have made a call and reported its peak",
				task.GetId(), o.GetSummary().GetIterations(), o.GetSummary().GetPeakTokens())
		}
	}
	need := func(id string) int64 {
		o := outcomes[id]
		return max(o.GetSummary().GetPeakTokens(), o.GetTokensSpent())
	}
	// The test shows something only if counting a task that did not answer
	// would change a forecast: their needs differ from the answered ones'.
	for _, id := range []string{"fails", "cut-off"} {
		if need(id) == need("answers-1") {
			t.Fatalf("task %s needed %d, as answers-1 did: counting it would change no forecast", id, need(id))
		}
	}

	started := map[string]int64{}
	for _, ev := range evs {
		if st := ev.GetTaskStarted(); st != nil {
			started[st.GetTaskId()] = st.GetForecastTokens()
		}
	}
	// One task at a time, in dispatch order: each is admitted once the one
	// before it ended.
	var answered []string
	for _, task := range s.GetTasks() {
		id := task.GetId()
		forecast, basis := task.GetTokenBudget(), "its token_budget (no task has answered yet)"
		if len(answered) > 0 {
			var sum int64
			for _, a := range answered {
				sum += need(a)
			}
			avg := (sum + int64(len(answered)) - 1) / int64(len(answered))
			forecast, basis = min(avg, task.GetTokenBudget()), fmt.Sprintf("the average need of %v", answered)
		}
		if got, ok := started[id]; !ok || got != forecast {
			t.Errorf("task %s started with forecast %d (started: %v); want %d, %s", id, got, ok, forecast, basis)
		}
		if got := outcomes[id].GetForecastTokens(); got != forecast {
			t.Errorf("task %s's outcome has forecast %d; want %d, %s", id, got, forecast, basis)
		}
		if st := outcomes[id].GetStatus(); st == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED ||
			st == fanoutv1.TaskStatus_TASK_STATUS_ITERATION_LIMIT {
			answered = append(answered, id)
		}
	}
}
