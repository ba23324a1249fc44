package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store/pglocal"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent/mcp"
)

// approvalFleet is issue 28's fleet: two worker processes and two
// orchestrators over one database, server-memory behind a recording shim,
// create_entities needing approval (memory: 2 minutes; memfast: 2 s),
// both servers kept to tenant e2e.
type approvalFleet struct {
	url, cfg, shimDir string
	srv               *pglocal.Server // the fleet's own PostgreSQL, which a subtest restarts
	flags, oflags     []string
	workers           []*workerProc
	o1, o2            *orchestratorProc
}

func newApprovalFleet(t *testing.T) *approvalFleet {
	t.Helper()
	script := serverMemory(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f := &approvalFleet{shimDir: filepath.Join(dir, "calls")}
	f.srv, f.url = startOwnCluster(t)
	if err := os.Mkdir(f.shimDir, 0o700); err != nil {
		t.Fatal(err)
	}
	server := func(name, timeout string) map[string]any {
		return map[string]any{"name": name, "transport": "stdio", "command": exe, "args": []string{"-test.run=^$"},
			"env": []any{
				map[string]string{"name": envMCPShim, "value": script},
				map[string]string{"name": envMCPShimDir, "value": f.shimDir},
				map[string]string{"name": "MEMORY_FILE_PATH", "value": filepath.Join(dir, name+".jsonl")},
			},
			"connect_timeout": "30s", "tenants": []string{"e2e"},
			"tools": []any{map[string]any{"name": "create_entities", "effect": "write", "approval": "required",
				"approval_timeout": timeout}},
		}
	}
	f.cfg = writeYAML(t, dir, "mcp.yaml", map[string]any{"servers": []any{server("memory", "2m"), server("memfast", "2s")}})
	// Each task's one reply before its answer makes three writes.
	f.flags = []string{"--mcp-config", f.cfg, "--sim-tool-calls", "3", "--sim-finish-after", "2", "--sim-latency", "20ms",
		"--poll-interval", e2ePoll, "--sweep-interval", e2eSweep, "--lease-ttl", "2s"}
	f.workers = []*workerProc{startWorkerProc(t, f.url, "w1", f.flags...), startWorkerProc(t, f.url, "w2", f.flags...)}
	// Short leases: a killed orchestrator's runs are adopted within seconds.
	f.oflags = append([]string{"--mcp-config", f.cfg}, leaseFlags...)
	f.o1 = startOrchestratorMain(t, f.url, f.workers, append([]string{"--name", "o1"}, f.oflags...)...)
	f.o2 = startOrchestratorMain(t, f.url, f.workers, append([]string{"--name", "o2"}, f.oflags...)...)
	return f
}

// start starts a one-task run allowed tool only, through o1 (or via).
func (f *approvalFleet) start(t *testing.T, key, tool string, via ...fanoutv1.OrchestratorServiceClient) string {
	t.Helper()
	s := e2eSpec(key, 1, 1_000_000)
	s.Tasks[0].AllowedTools = []string{tool}
	c := f.o1.client
	if len(via) > 0 {
		c = via[0]
	}
	r, err := c.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	return r.GetRunId()
}

// events streams a run's events through o2 (another replica than the one
// driving it) until it ends.
func (f *approvalFleet) events(t *testing.T, runID string) <-chan *fanoutv1.RunEvent {
	t.Helper()
	ch := make(chan *fanoutv1.RunEvent, 64)
	stream, err := f.o2.client.WatchRun(t.Context(), &fanoutv1.WatchRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(ch)
		for {
			resp, err := stream.Recv()
			if err != nil {
				if !errors.Is(err, io.EOF) && t.Context().Err() == nil {
					t.Errorf("watch %s: %v", runID, err)
				}
				return
			}
			ch <- resp.GetEvent()
		}
	}()
	return ch
}

// next returns the next event of evs that match picks, failing after 60 s.
func next(t *testing.T, evs <-chan *fanoutv1.RunEvent, what string, match func(*fanoutv1.RunEvent) bool) *fanoutv1.RunEvent {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case ev, ok := <-evs:
			if !ok {
				t.Fatalf("the run's events ended before %s", what)
			}
			if match(ev) {
				return ev
			}
		case <-deadline:
			t.Fatalf("no %s within 60 s", what)
		}
	}
}

func isApproval(ev *fanoutv1.RunEvent) bool { return ev.GetApprovalRequested() != nil }

// approveAll approves the run's three writes through o2 as each is asked
// for (first, already seen, included), then checks that the run and its
// task succeeded and that each write reached server-memory exactly once.
func (f *approvalFleet) approveAll(t *testing.T, runID string, evs <-chan *fanoutv1.RunEvent, first string) []*fanoutv1.RunEvent {
	t.Helper()
	approved := map[string]bool{}
	approve := func(callID string) {
		t.Helper()
		var err error
		for range 50 { // the API may be between connections for a moment after a restart
			if _, err = f.o2.client.ApproveToolCall(t.Context(), &fanoutv1.ApproveToolCallRequest{CallId: callID, Reason: "ok"}); err == nil {
				approved[callID] = true
				return
			}
			time.Sleep(100 * time.Millisecond) // a retry with a bound: 50 tries, 5 s
		}
		t.Fatalf("approve %s: %v", callID, err)
	}
	approve(first)
	var seen []*fanoutv1.RunEvent
	for len(approved) < 3 {
		ev := next(t, evs, "the next ApprovalRequested", func(ev *fanoutv1.RunEvent) bool {
			seen = append(seen, ev)
			return isApproval(ev)
		})
		if id := ev.GetApprovalRequested().GetCallId(); !approved[id] { // a new attempt reports a call again
			approve(id)
		}
	}
	fin := next(t, evs, "RunFinished", func(ev *fanoutv1.RunEvent) bool {
		seen = append(seen, ev)
		return isFinish(ev)
	}).GetRunFinished()
	o := fin.GetResult().GetTasks()[0]
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED || o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED ||
		len(o.GetSummary().GetFailed()) != 0 {
		t.Fatalf("run %s (%s), task %s (%s), failed %q; want both succeeded", fin.GetState(), fin.GetCancelCause(),
			o.GetStatus(), o.GetSummary().GetError(), o.GetSummary().GetFailed())
	}
	keys := f.serverCalls(t, runID)
	once := map[string]int{}
	for _, k := range keys {
		once[k]++
	}
	if len(keys) != 3 || len(once) != 3 {
		t.Errorf("server-memory got %q; want three writes, each once", keys)
	}
	return seen
}

func isFinish(ev *fanoutv1.RunEvent) bool { return ev.GetRunFinished() != nil }

// serverCalls is how many tools/call requests of tool the shims recorded
// for the run (its entities are named after the task and run, as the sim
// makes them: the test counts by idempotency key prefix).
func (f *approvalFleet) serverCalls(t *testing.T, runID string) []string {
	t.Helper()
	var keys []string
	for _, r := range readShimRecords(t, f.shimDir) {
		key, _ := r.Meta[mcp.MetaIdempotencyKey].(string)
		if r.Kind == "request" && strings.HasPrefix(key, runID+"/") {
			keys = append(keys, key)
		}
	}
	return keys
}

// TestApprovalsEndToEnd (issue 28, done when): over real processes, a
// write that needs approval waits; the worker holding the task is killed
// and replaced, and the approval given through the other orchestrator
// meanwhile is honoured by the task's next attempt: each of the reply's
// three writes, approved one by one, reaches server-memory exactly once; a
// worker's login skipping the gate is refused by the database; a denial
// reaches the model; a timeout denies; another tenant's run cannot name
// the tool.
func TestApprovalsEndToEnd(t *testing.T) {
	t.Parallel()
	f := newApprovalFleet(t)
	tool := mcp.ModelName("memory", "create_entities")
	pool := openPool(t, f.url)

	t.Run("approved after the worker was killed and replaced", func(t *testing.T) {
		runID := f.start(t, "approve-after-kill", tool)
		evs := f.events(t, runID)
		first := next(t, evs, "ApprovalRequested", isApproval).GetApprovalRequested()
		if first.GetCallId() == "" || first.GetPreview() == "" || first.GetDeadline() == nil || first.GetTool() != tool {
			t.Fatalf("ApprovalRequested %v; want its call id, preview, deadline and tool", first)
		}
		// A worker patched to send without waiting: its login cannot
		// move the call past the gate.
		wconn, err := pgx.Connect(t.Context(), storetest.WorkerURL(t, f.url))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = wconn.Close(context.Background()) }()
		if _, err := wconn.Exec(t.Context(), `UPDATE fanout.tool_call SET state = 'issued' WHERE call_id = $1`, first.GetCallId()); err == nil {
			t.Error("a worker's login moved the waiting call to issued")
		}
		if _, err := wconn.Exec(t.Context(), `SELECT fanout.tool_call_decide('e2e', $1, 'approved', 'key:fk_0000000000000000', '')`,
			first.GetCallId()); err == nil {
			t.Error("a worker's login approved the call")
		}
		var holder string
		if err := pool.QueryRow(t.Context(), `SELECT worker FROM task WHERE run_id = $1`, runID).Scan(&holder); err != nil {
			t.Fatal(err)
		}
		var victim int
		for i, w := range f.workers {
			if w.name == holder {
				victim = i
			}
		}
		addr := f.workers[victim].addr
		f.workers[victim].kill(t)
		f.workers[victim] = startWorkerProc(t, f.url, holder+"b", append(f.flags, "--listen", addr)...)
		if n := len(f.serverCalls(t, runID)); n != 0 {
			t.Fatalf("%d writes reached the server before any approval", n)
		}
		f.approveAll(t, runID, evs, first.GetCallId())
		var attempt int
		if err := pool.QueryRow(t.Context(), `SELECT attempt FROM account WHERE run_id = $1 AND kind = 'task'`, runID).Scan(&attempt); err != nil || attempt < 2 {
			t.Errorf("the task's attempt is %d (%v); want 2 or more: it was dispatched again after the kill", attempt, err)
		}
		var decided int
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM tool_call_decisions WHERE run_id = $1 AND decision = 'approved'
			AND actor = 'anonymous' AND call_state = 'done'`, runID).Scan(&decided); err != nil || decided != 3 {
			t.Errorf("decision log: %d approved and done, %v; want 3", decided, err)
		}
		checkConserved(t, pool, runID)
	})

	t.Run("approved while the orchestrator was dead, after its run was adopted", func(t *testing.T) {
		doomed := startOrchestratorProc(t, f.url, "doomed", f.workers, f.oflags...)
		runID := f.start(t, "approve-after-adoption", tool, dial(t, doomed.addr))
		evs := f.events(t, runID)
		first := next(t, evs, "ApprovalRequested", isApproval).GetApprovalRequested()
		doomed.kill(t)
		seen := f.approveAll(t, runID, evs, first.GetCallId())
		adopted := false
		for _, ev := range seen {
			adopted = adopted || ev.GetRunAdopted().GetPreviousOwner() == "doomed"
		}
		if !adopted {
			t.Error("no RunAdopted from doomed: the run did not change hands")
		}
		checkConserved(t, pool, runID)
	})

	t.Run("the wait survives a PostgreSQL restart", func(t *testing.T) {
		runID := f.start(t, "approve-across-restart", tool)
		evs := f.events(t, runID)
		first := next(t, evs, "ApprovalRequested", isApproval).GetApprovalRequested()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if err := f.srv.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		f.approveAll(t, runID, evs, first.GetCallId())
		checkConserved(t, pool, runID)
	})

	t.Run("a denial reaches the model", func(t *testing.T) {
		runID := f.start(t, "deny", tool)
		evs := f.events(t, runID)
		a := next(t, evs, "ApprovalRequested", isApproval).GetApprovalRequested()
		if _, err := f.o1.client.DenyToolCall(t.Context(), &fanoutv1.DenyToolCallRequest{CallId: a.GetCallId(), Reason: "not this one"}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.o2.client.ApproveToolCall(t.Context(), &fanoutv1.ApproveToolCallRequest{CallId: a.GetCallId()}); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("approve a denied call: %v; want FAILED_PRECONDITION", err)
		}
		// The decision is on the run's log, once: the refused approval
		// after it records nothing.
		var decisions []*fanoutv1.ApprovalDecided
		fin := next(t, evs, "RunFinished", func(ev *fanoutv1.RunEvent) bool {
			if d := ev.GetApprovalDecided(); d != nil {
				decisions = append(decisions, d)
			}
			return isFinish(ev)
		}).GetRunFinished()
		if len(decisions) != 1 || decisions[0].GetCallId() != a.GetCallId() || decisions[0].GetApproved() ||
			decisions[0].GetReason() != "not this one" || decisions[0].GetActor() != "anonymous" || decisions[0].GetTool() != a.GetTool() {
			t.Errorf("ApprovalDecided events before RunFinished: %v; want one: %s denied by anonymous, \"not this one\"", decisions, a.GetCallId())
		}
		failed := strings.Join(fin.GetResult().GetTasks()[0].GetSummary().GetFailed(), "\n")
		if !strings.Contains(failed, "denied by anonymous: not this one") || !strings.Contains(failed, "an earlier write in this reply failed") {
			t.Errorf("the task's failed calls %q; want the denial and the reply's later writes not run", failed)
		}
		if keys := f.serverCalls(t, runID); len(keys) != 0 {
			t.Errorf("server-memory got %q after the denial; want nothing", keys)
		}
	})

	t.Run("nobody decides: the approval expires", func(t *testing.T) {
		runID := f.start(t, "expire", mcp.ModelName("memfast", "create_entities"))
		evs := f.events(t, runID)
		fin := next(t, evs, "RunFinished", isFinish).GetRunFinished()
		if failed := strings.Join(fin.GetResult().GetTasks()[0].GetSummary().GetFailed(), "\n"); !strings.Contains(failed, "denied: the approval expired") {
			t.Errorf("the task's failed calls %q; want the expiry", failed)
		}
		if keys := f.serverCalls(t, runID); len(keys) != 0 {
			t.Errorf("server-memory got %q; want nothing", keys)
		}
	})

	t.Run("another tenant cannot name the tool", func(t *testing.T) {
		s := e2eSpec("other-tenant", 1, 1_000_000)
		s.TenantId = "other"
		s.Tasks[0].AllowedTools = []string{tool}
		_, err := tenantClient(t, f.o1.addr, "other").StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(),
			fmt.Sprintf("task %q may not use tool %q", "t00", tool)) {
			t.Errorf("tenant other names %s: %v; want INVALID_ARGUMENT naming the task and the tool", tool, err)
		}
	})
}
