package node_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fanout/fanout/node"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// The cost of one running subagent, orchestrator and worker together,
// that TestRunningSubagentCost holds the real wiring to (docs/operations.md
// "Memory"): the orchestrator's dispatch and gRPC's watch of its stream;
// the worker's Execute and its watch of the run.
const (
	goroutinesPerSubagent = 4
	stackPerSubagent      = 40 << 10 // bytes of goroutine stacks, both sides in one process
)

// TestRunningSubagentCost: while subagents wait on their model call (the
// state a subagent spends its life in), each holds at most
// goroutinesPerSubagent goroutines and stackPerSubagent of goroutine
// stacks across an orchestrator and a worker opened as `fanout
// orchestrator` and `fanout worker` open them. Measured at two numbers
// in flight, 1 and 1+n, so that what the connection and a run hold is
// not counted. The stacks are not checked under -race, whose
// instrumentation deepens every frame. Not parallel: it counts the
// process's goroutines and stacks.
func TestRunningSubagentCost(t *testing.T) { //nolint:paralleltest // counts the process's goroutines
	const n = 200
	url := storetest.NewDB(t)
	_, workerTrust, _, err := node.DevTrust(peerDir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := node.OpenWorker(t.Context(), backend(t, url, node.BackendConfig{}), node.WorkerConfig{Trust: workerTrust,
		Sim: llm.SimConfig{Latency: time.Minute, FinishAfter: 1}, Server: subagent.ServerConfig{Name: "w1", Capacity: n + 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	o := startOrchestrator(t, backend(t, url, node.BackendConfig{}), node.OrchestratorConfig{Workers: w.Addr(),
		Auth: node.CallerAuth{None: true}, Engine: orchestrator.Config{MaxTasks: n, MaxConcurrency: n}})
	conn, err := grpc.NewClient(o.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := fanoutv1.NewOrchestratorServiceClient(conn)
	start := func(key string, tasks int) {
		t.Helper()
		spec := &fanoutv1.RunSpec{IdempotencyKey: key, Goal: "wait", Model: &fanoutv1.ModelSettings{Provider: "sim"},
			Budget: &fanoutv1.Budget{LimitTokens: int64(tasks) * 5_000}, Limits: &fanoutv1.Limits{MaxConcurrency: int32(tasks)}}
		for i := range tasks {
			spec.Tasks = append(spec.Tasks, &fanoutv1.TaskSpec{Id: fmt.Sprintf("t%d", i), Instruction: "take a minute",
				TokenBudget: 5_000, MaxIterations: 1})
		}
		started, err := client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: spec})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { // end the minute-long run now, not at shutdown
			_, _ = client.CancelRun(context.WithoutCancel(t.Context()), &fanoutv1.CancelRunRequest{RunId: started.GetRunId()})
		})
	}
	// waitCalls waits until calls model calls have begun, then until the
	// process's goroutines stop changing (what started them has settled).
	waitCalls := func(calls int) (goroutines int, stacks uint64) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for len(w.Sim().Calls()) < calls {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d model calls began within a minute", len(w.Sim().Calls()), calls)
			}
			time.Sleep(10 * time.Millisecond)
		}
		for last := -1; ; {
			runtime.GC() // shrinks stacks that were grown and no longer used
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			g := runtime.NumGoroutine()
			if g == last || time.Now().After(deadline) {
				return g, m.StackInuse
			}
			last = g
			time.Sleep(100 * time.Millisecond)
		}
	}
	start("one", 1)
	g1, s1 := waitCalls(1)
	start("many", n)
	g2, s2 := waitCalls(1 + n)

	goroutines := float64(g2-g1) / n
	stack := float64(s2-s1) / n
	t.Logf("per running subagent: %.2f goroutines, %.1f KiB of stacks (%d subagents; race detector %v)",
		goroutines, stack/1024, n, raceEnabled)
	// A run's own goroutines (its driver, its watch) are in the difference:
	// a few, over n subagents.
	if goroutines > goroutinesPerSubagent+0.1 {
		t.Errorf("a running subagent holds %.2f goroutines, orchestrator and worker together; want at most %d",
			goroutines, goroutinesPerSubagent)
	}
	if !raceEnabled && stack > stackPerSubagent {
		t.Errorf("a running subagent holds %.1f KiB of goroutine stacks, orchestrator and worker together; want at most %d KiB",
			stack/1024, stackPerSubagent>>10)
	}
}
