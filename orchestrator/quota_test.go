package orchestrator_test

import (
	"sort"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/llm"
)

// setQuotas gives tenant t1 quotas, as the owner does (fanout tenant).
func (b *testBundle) setQuotas(t *testing.T, maxRunTokens, maxConcurrentRuns, maxTasksInFlight any) {
	t.Helper()
	if _, err := b.pool.Exec(t.Context(), `INSERT INTO tenant (tenant_id, max_run_tokens, max_concurrent_runs, max_tasks_in_flight)
		VALUES ('t1', $1, $2, $3) ON CONFLICT (tenant_id) DO UPDATE SET max_run_tokens = $1,
		max_concurrent_runs = $2, max_tasks_in_flight = $3`, maxRunTokens, maxConcurrentRuns, maxTasksInFlight); err != nil {
		t.Fatal(err)
	}
}

func (b *testBundle) runCount(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(t.Context(), `SELECT count(*) FROM run WHERE tenant_id = 't1'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A run budget over the tenant's max_run_tokens is RESOURCE_EXHAUSTED
// naming the field and the cap, and writes nothing.
func TestRunBudgetOverTheTenantsCap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := b.orchestrator(t, "a", orchestrator.Config{})
	b.setQuotas(t, 5_000, nil, nil)
	_, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: spec("over-cap", 2, 6_000)})
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("StartRun over the tenant's cap: %v, want RESOURCE_EXHAUSTED", err)
	}
	var named bool
	for _, d := range st.Details() {
		if qf, ok := d.(*errdetails.QuotaFailure); ok {
			for _, v := range qf.GetViolations() {
				named = named || v.GetSubject() == "spec.budget.limit_tokens"
			}
		}
	}
	if !named {
		t.Errorf("the refusal %v names no spec.budget.limit_tokens quota violation", st.Details())
	}
	if got := b.runCount(t); got != 0 {
		t.Errorf("%d runs written by a refused StartRun", got)
	}
	resp, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: spec("at-cap", 2, 5_000)})
	if err != nil {
		t.Fatalf("StartRun at the cap: %v", err)
	}
	if _, err := n.client.CancelRun(t.Context(), &fanoutv1.CancelRunRequest{RunId: resp.GetRunId()}); err != nil {
		t.Fatal(err)
	}
	watchAll(t, n.client, resp.GetRunId())
}

// Six runs of a tenant capped at two running are submitted at once on two
// replicas: exactly two are admitted (the count is taken under the
// tenant's lock), the others are RESOURCE_EXHAUSTED naming the quota, and
// a retry of an admitted run while at the cap gets that run back.
func TestConcurrentRunsCapHoldsAcrossReplicas(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w", llm.SimConfig{Latency: time.Minute}, 64) // the runs stay RUNNING
	nodes := []*node{b.orchestrator(t, "a", orchestrator.Config{}, w), b.orchestrator(t, "b", orchestrator.Config{}, w)}
	b.setQuotas(t, nil, 2, nil)
	var mu sync.Mutex
	var admitted []string
	refused := 0
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			resp, err := nodes[i%2].client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: spec("cap-"+string(rune('a'+i)), 1, 10_000)})
			mu.Lock()
			defer mu.Unlock()
			switch st := status.Convert(err); {
			case err == nil:
				admitted = append(admitted, resp.GetRunId())
			case st.Code() == codes.ResourceExhausted:
				refused++
			default:
				t.Errorf("StartRun: %v, want OK or RESOURCE_EXHAUSTED", err)
			}
		})
	}
	wg.Wait()
	if len(admitted) != 2 || refused != 4 {
		t.Fatalf("%d runs admitted and %d refused under a cap of 2 concurrent runs, want 2 and 4", len(admitted), refused)
	}
	if got := b.runCount(t); got != 2 {
		t.Errorf("%d runs stored, want the 2 admitted", got)
	}
	// A retry of an admitted run is not a new run: it is answered, not refused.
	run, err := nodes[0].client.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: admitted[0]})
	if err != nil {
		t.Fatal(err)
	}
	again, err := nodes[1].client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: run.GetRun().GetSpec()})
	if err != nil || again.GetRunId() != admitted[0] {
		t.Errorf("a retry of an admitted run at the cap: %v, %v; want run %s", again, err, admitted[0])
	}
	// Once one ends, there is room for one more.
	if _, err := nodes[0].client.CancelRun(t.Context(), &fanoutv1.CancelRunRequest{RunId: admitted[0]}); err != nil {
		t.Fatal(err)
	}
	watchAll(t, nodes[0].client, admitted[0])
	after, err := nodes[1].client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: spec("cap-after", 1, 10_000)})
	if err != nil {
		t.Fatalf("StartRun after a run ended: %v", err)
	}
	for _, id := range append(admitted[1:], after.GetRunId()) {
		if _, err := nodes[0].client.CancelRun(t.Context(), &fanoutv1.CancelRunRequest{RunId: id}); err != nil {
			t.Fatal(err)
		}
	}
}

// A tenant capped at two tasks in flight has two runs of four tasks each
// on two replicas: across the fleet no more than two of its tasks ever
// have a model call open at once, and two do.
func TestTenantTasksInFlightAreBoundFleetWide(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, sim := b.worker(t, "w", llm.SimConfig{Latency: 200 * time.Millisecond, FinishAfter: 2}, 64)
	nodes := []*node{b.orchestrator(t, "a", orchestrator.Config{}, w), b.orchestrator(t, "b", orchestrator.Config{}, w)}
	b.setQuotas(t, nil, nil, 2)
	ids := make([]string, 2)
	for i := range ids {
		s := spec("slots-"+string(rune('a'+i)), 4, 200_000)
		s.Limits = &fanoutv1.Limits{MaxConcurrency: 4}
		resp, err := nodes[i].client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = resp.GetRunId()
	}
	for i, id := range ids {
		evs := watchAll(t, nodes[i].client, id)
		if st := evs[len(evs)-1].GetRunFinished().GetState(); st != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
			t.Errorf("run %d ended %s", i, st)
		}
	}
	if most := mostTasksAtOnce(sim.Calls()); most != 2 {
		t.Errorf("at most %d of the tenant's tasks had a call open at once, want exactly its max_tasks_in_flight 2", most)
	}
}

// mostTasksAtOnce is the largest number of distinct tasks with a call open
// at one instant.
func mostTasksAtOnce(calls []llm.CallRecord) int {
	type edge struct {
		at   time.Time
		task string
		open bool
	}
	var edges []edge
	for _, c := range calls {
		task := c.RunID + "/" + c.TaskID
		edges = append(edges, edge{c.Start, task, true}, edge{c.End, task, false})
	}
	sort.Slice(edges, func(i, j int) bool {
		if !edges[i].at.Equal(edges[j].at) {
			return edges[i].at.Before(edges[j].at)
		}
		return !edges[i].open // a call that ends at the instant another starts is not open with it
	})
	open := map[string]int{}
	most := 0
	for _, e := range edges {
		if e.open {
			open[e.task]++
		} else if open[e.task]--; open[e.task] == 0 {
			delete(open, e.task)
		}
		most = max(most, len(open))
	}
	return most
}
