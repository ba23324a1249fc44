package orchestrator_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	fanoutnode "github.com/fanout/fanout/node"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// barrierModel holds every model call until n calls have arrived, or
// until patience has passed since the first one did; then every call goes
// on to the wrapped model. While it holds, no task can finish: a task that
// starts does so before any has finished, whatever the machine's speed.
type barrierModel struct {
	llm.Model
	n        int
	patience time.Duration

	mu      sync.Mutex
	arrived int
	full    chan struct{} // closed when n calls have arrived
	first   chan struct{} // closed when the first call arrives
}

func newBarrierModel(sim llm.Model, n int, patience time.Duration) *barrierModel {
	return &barrierModel{Model: sim, n: n, patience: patience, full: make(chan struct{}), first: make(chan struct{})}
}

func (m *barrierModel) Call(ctx context.Context, req llm.Request) (llm.Response, error) {
	m.mu.Lock()
	m.arrived++
	switch m.arrived {
	case 1:
		close(m.first)
		if m.n == 1 {
			close(m.full)
		}
	case m.n:
		close(m.full)
	}
	m.mu.Unlock()
	t := time.NewTimer(m.patience) // from this call's arrival, so at least patience after the first
	defer t.Stop()
	select {
	case <-m.full:
	case <-t.C:
	case <-ctx.Done():
		return llm.Response{}, context.Cause(ctx)
	}
	return m.Model.Call(ctx, req)
}

// capacityWorker starts a subagent worker of the given capacity whose sim
// model (cfg) is wrapped by wrap.
func (b *testBundle) capacityWorker(t *testing.T, name string, capacity int, cfg llm.SimConfig, wrap func(sim llm.Model) llm.Model) string {
	t.Helper()
	_, wt := trust(t)
	w, err := fanoutnode.OpenWorker(t.Context(), b.backend, fanoutnode.WorkerConfig{Trust: wt, Sim: cfg,
		ModelsFunc: func(_ *fanoutnode.Backend, sim llm.Model) (subagent.ModelFunc, error) {
			return subagent.SimModels(wrap(sim)), nil
		},
		Server: subagent.ServerConfig{Name: name, Capacity: capacity}})
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

// oneWaveSpec is a task of each token_budget of budgets, each one model
// call (no tools, one iteration), all allowed at once, under a run budget
// of limit and min_reservation minRes (0: the default, 256), admission by
// forecast (the default).
func oneWaveSpec(key string, budgets []int64, limit, minRes int64) *fanoutv1.RunSpec {
	s := &fanoutv1.RunSpec{
		IdempotencyKey: key,
		TenantId:       "t1",
		Goal:           "find facts",
		Budget:         &fanoutv1.Budget{LimitTokens: limit, MinReservationTokens: minRes},
		Limits:         &fanoutv1.Limits{MaxConcurrency: int32(len(budgets))},
		Model:          &fanoutv1.ModelSettings{Provider: "sim", MaxOutputTokens: 64},
	}
	for i, b := range budgets {
		s.Tasks = append(s.Tasks, &fanoutv1.TaskSpec{Id: fmt.Sprintf("t%03d", i),
			Instruction: fmt.Sprintf("look up item %d", i), TokenBudget: b, MaxIterations: 1})
	}
	return s
}

// nOf is n token_budgets of b.
func nOf(n int, b int64) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = b
	}
	return out
}

// startedBeforeFirstFinish counts the tasks whose TaskStarted precedes the
// run's first TaskFinished: the tasks of the first wave.
func startedBeforeFirstFinish(evs []*fanoutv1.RunEvent) (started int, forecasts map[string]int64) {
	forecasts = map[string]int64{}
	for _, ev := range evs {
		if ev.GetTaskFinished() != nil {
			break
		}
		if st := ev.GetTaskStarted(); st != nil {
			started++
			forecasts[st.GetTaskId()] = st.GetForecastTokens()
		}
	}
	return started, forecasts
}

// runOneWave runs oneWaveSpec(budgets, limit, minRes) on one worker whose model
// holds every call until one per task has arrived (or patience has
// passed), checks that it SUCCEEDED with every task SUCCEEDED and the
// ledger conserved, and returns its events.
func runOneWave(t *testing.T, key string, budgets []int64, limit, minRes int64, patience time.Duration) []*fanoutv1.RunEvent {
	t.Helper()
	b := setup(t)
	n := len(budgets)
	w := b.capacityWorker(t, "w", n, llm.SimConfig{FinishAfter: 1},
		func(sim llm.Model) llm.Model { return newBarrierModel(sim, n, patience) })
	o := b.orchestrator(t, "o", orchestrator.Config{}, w)
	evs := runStream(t, o.client, oneWaveSpec(key, budgets, limit, minRes))
	fin := checkEvents(t, evs)
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("run ended %s (%s), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	if got := len(fin.GetResult().GetTasks()); got != n {
		t.Fatalf("%d task outcomes, want %d", got, n)
	}
	for _, o := range fin.GetResult().GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			t.Fatalf("task %s ended %s (%q), want SUCCEEDED", o.GetTaskId(), o.GetStatus(), o.GetSummary().GetError())
		}
	}
	b.checkLedger(t)
	return evs
}

// TestOneWaveWhenTheBudgetCoversEveryTask: docs/budget.md, "Admission by
// forecast": when every task has a token_budget and they add up to at most
// the run's limit less what it holds, the tasks may claim all of that (no
// task can take the run past it: each one's own account stops it), so a
// run whose budget is exactly the sum of its tasks' token_budgets starts
// every task at once, up to its concurrency: at N = 10 and 100, every
// TaskStarted precedes the first TaskFinished. The worker's model holds
// every call until all N have arrived, so no task can end before the last
// one has started; under the old rule (what the tasks may claim less the
// run's min_reservation) the last task waited for the first to end.
func TestOneWaveWhenTheBudgetCoversEveryTask(t *testing.T) {
	t.Parallel()
	const taskBudget = 5_000
	for _, n := range []int{10, 100} {
		t.Run(fmt.Sprintf("N=%d", n), func(t *testing.T) {
			t.Parallel()
			// patience bounds only a failing run: the last call of a
			// passing one arrives long before it.
			evs := runOneWave(t, fmt.Sprintf("one-wave-%d", n), nOf(n, taskBudget), int64(n)*taskBudget, 0, 30*time.Second)
			started, forecasts := startedBeforeFirstFinish(evs)
			if started != n {
				t.Fatalf("%d of %d tasks started before the first one finished; want all of them: the run's budget "+
					"(%d) is the sum of their token_budgets", started, n, n*taskBudget)
			}
			for id, f := range forecasts {
				if f != taskBudget {
					t.Errorf("task %s started with forecast %d, want its token_budget %d", id, f, taskBudget)
				}
			}
		})
	}
}

// TestNoOneWaveWhenTheBudgetFallsShortOfTheTasks: the edge of the rule
// above. Tasks whose token_budgets add up to one token more than the run's
// limit may claim the limit less the run's min_reservation, as in any run
// whose tasks' token_budgets do not fit in it:
//   - 10 tasks of 5,000 under a limit of 49,999 (min_reservation 256, the
//     default): 9 start at once and the tenth waits for one of them to end;
//   - tasks of 5,000, 4,001 and 1,000 under a limit of 10,000 and a
//     min_reservation of 1,000: the first starts alone (5,000 + 4,001 is
//     more than 10,000 - 1,000), where all of the limit would have started
//     the second with it. (The last task's token_budget is the least that
//     pays a call's min_reservation, so one token over is the closest
//     such a run comes to the rule's edge.)
//
// The model holds every call until one per task has arrived or 2 s have
// passed: a task that started with the others did so before any ended.
func TestNoOneWaveWhenTheBudgetFallsShortOfTheTasks(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		budgets []int64
		limit   int64
		minRes  int64
		wave    int
	}{
		{name: "10 of 5,000 under 49,999", budgets: nOf(10, 5_000), limit: 49_999, wave: 9},
		{name: "5,000, 4,001 and 1,000 under 10,000", budgets: []int64{5_000, 4_001, 1_000}, limit: 10_000, minRes: 1_000, wave: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			evs := runOneWave(t, "one-wave-short-"+fmt.Sprint(len(c.budgets)), c.budgets, c.limit, c.minRes, 2*time.Second)
			if started, _ := startedBeforeFirstFinish(evs); started != c.wave {
				t.Fatalf("%d of %d tasks started before the first one finished; want %d: the limit %d less the "+
					"min_reservation pays for no more of their token_budgets %v", started, len(c.budgets), c.wave, c.limit, c.budgets)
			}
		})
	}
}
