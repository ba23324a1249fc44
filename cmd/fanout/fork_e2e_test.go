package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent/mcp"
)

// TestForkEndToEnd (issue 46, parts 2 and 4's tasks): over a worker
// process and server-memory behind the recording shim, a fork with one
// task changed makes model calls for that task and the one that depends on
// it only, and sends none of the reused task's writes again; its quote
// (REST, and the CLI) says so before anything is written; a retry with its
// key returns the same run; another tenant cannot fork it. Then the result
// cache: a run of the same tenant with the source's spec reuses every task
// (no model call, no write), one whose max age is shorter than the
// entries' age none, and the same run of another tenant none.
func TestForkEndToEnd(t *testing.T) {
	t.Parallel()
	cfg, shimDir, _ := memoryServerConfig(t, []any{map[string]any{"name": "create_entities", "effect": "write"}})
	url := storetest.NewDB(t)
	pool := openPool(t, url)
	w := startWorkerProc(t, url, "w1", "--mcp-config", cfg, "--sim-tool-calls", "1", "--sim-finish-after", "2",
		"--sim-latency", "20ms", "--poll-interval", e2ePoll, "--sweep-interval", e2eSweep)
	o := startOrchestratorMain(t, url, []*workerProc{w}, "--mcp-config", cfg, "--http-listen", "127.0.0.1:0",
		"--poll-interval", e2ePoll, "--sweep-interval", e2eSweep)
	waitFleetConnected(t, o.client, 1)

	// t00 and t02 (which depends on t00) search; t01 writes.
	before := countRuns(t, o.client) // waitFleetConnected's
	s := e2eSpec("fork-source", 3, 1_000_000)
	s.Tasks[1].AllowedTools = []string{mcp.ModelName("memory", "create_entities")}
	s.Tasks[2].DependsOn = []string{"t00"}
	src := runAll(t, o.client, s)
	srcID := src[0].GetRunId()
	srcFin := src[len(src)-1].GetRunFinished()
	if srcFin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("source run ended %s (%s), want SUCCEEDED", srcFin.GetState(), srcFin.GetCancelCause())
	}
	srcWrites := runWrites(t, shimDir, srcID)
	if srcWrites == 0 {
		t.Fatalf("the source's task t01 sent no write: the test proves nothing")
	}
	srcB := srcFin.GetResult().GetTasks()[1]

	changed := proto.CloneOf(s.Tasks[0])
	changed.Instruction = "look up item 0 again, in another source"
	fork := &fanoutv1.ForkRunRequest{RunId: srcID, IdempotencyKey: "fork-1", Tasks: []*fanoutv1.TaskSpec{changed}}

	// The quote, over REST, writes nothing.
	body, err := protojson.Marshal(&fanoutv1.ForkRunRequest{IdempotencyKey: "fork-quote", Tasks: fork.Tasks, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	code, out := postAs(t, o.http+"/v1/runs/"+srcID+":fork", "e2e", string(body))
	if code != 200 {
		t.Fatalf("POST /v1/runs/%s:fork: %d %s", srcID, code, out)
	}
	var quoted fanoutv1.ForkRunResponse
	if err := protojson.Unmarshal([]byte(out), &quoted); err != nil {
		t.Fatalf("decode %s: %v", out, err)
	}
	var lines []string
	for _, l := range quoted.GetQuote().GetTasks() {
		lines = append(lines, fmt.Sprintf("%s runs=%t reused=%s", l.GetTaskId(), l.GetRuns(), l.GetReused().GetTaskId()))
	}
	if want := []string{"t00 runs=true reused=", "t01 runs=false reused=t01", "t02 runs=true reused="}; !slices.Equal(lines, want) ||
		quoted.GetRunId() != "" || !slices.Equal(quoted.GetReusedTaskIds(), []string{"t01"}) {
		t.Errorf("quote: run %q, reused %q, lines %q; want no run, t01 reused, lines %q", quoted.GetRunId(),
			quoted.GetReusedTaskIds(), lines, want)
	}
	if why := quoted.GetQuote().GetTasks()[2].GetReason(); why != "depends on a task that runs" {
		t.Errorf("t02's reason %q, want that it depends on a task that runs", why)
	}
	if _, err := o.client.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: srcID}); err != nil {
		t.Fatal(err)
	}
	if n := countRuns(t, o.client) - before; n != 1 {
		t.Errorf("%d runs after the quote, want the source alone", n)
	}
	// The CLI's quote says the same.
	var stdout, stderr bytes.Buffer
	if code := Main(t.Context(), []string{"fork", srcID, "--addr", o.addr, "--tenant", "e2e", "--task", "t00=" + changed.Instruction, "--quote"},
		&stdout, &stderr, func(string) string { return "" }); code != 0 {
		t.Fatalf("fanout fork --quote exited %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "1 task(s) reused") || !strings.Contains(stdout.String(), "depends on a task that runs") {
		t.Errorf("fanout fork --quote printed:\n%s", stdout.String())
	}

	// The fork: t00 and t02 run, t01 reuses the source's facts.
	resp, err := o.client.ForkRun(t.Context(), fork)
	if err != nil {
		t.Fatal(err)
	}
	forkID := resp.GetRunId()
	if !slices.Equal(resp.GetReusedTaskIds(), []string{"t01"}) {
		t.Errorf("the fork reuses %q, want t01", resp.GetReusedTaskIds())
	}
	evs := watchAll(t, o.client, forkID, nil)
	fin := evs[len(evs)-1].GetRunFinished()
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("fork ended %s (%s), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	got, err := o.client.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: forkID})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetRun().GetForkedFrom() != srcID {
		t.Errorf("fork's forked_from %q, want %s", got.GetRun().GetForkedFrom(), srcID)
	}
	b := got.GetRun().GetTasks()[1]
	want := &fanoutv1.ReusedFrom{RunId: srcID, TaskId: "t01", Via: "fork", FinishedAt: srcB.GetFinishedAt(),
		TokensSaved: srcB.GetTokensSpent(), Writes: int32(srcWrites)}
	if b.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED || b.GetTokensSpent() != 0 || !proto.Equal(b.GetReused(), want) ||
		len(b.GetSummary().GetFacts()) == 0 {
		t.Errorf("fork's t01: %s, spent %d, reused %v, %d facts; want SUCCEEDED, 0, %v, the source's facts",
			b.GetStatus(), b.GetTokensSpent(), b.GetReused(), len(b.GetSummary().GetFacts()), want)
	}
	if want.GetTokensSaved() == 0 {
		t.Errorf("the source's t01 spent nothing: the test proves nothing")
	}
	finished := 0
	for _, ev := range evs {
		if o := ev.GetTaskFinished().GetOutcome(); o.GetTaskId() == "t01" && proto.Equal(o.GetReused(), want) {
			finished++
		}
	}
	if finished != 1 {
		t.Errorf("%d TaskFinished of t01 naming its source, want 1", finished)
	}
	if called := calledTasks(t, w, forkID); !slices.Equal(called, []string{"t00", "t02"}) {
		t.Errorf("the fork called the model for %q, want t00 and t02 only", called)
	}
	if n := runWrites(t, shimDir, forkID); n != 0 {
		t.Errorf("the fork sent %d writes, want 0 (t01's were sent by the source)", n)
	}
	checkConserved(t, pool, forkID)

	// A retry with the key returns the same run; the key with another
	// fork is refused.
	again, err := o.client.ForkRun(t.Context(), fork)
	if err != nil || again.GetRunId() != forkID || !slices.Equal(again.GetReusedTaskIds(), []string{"t01"}) {
		t.Errorf("retry: run %q, reused %q, err %v; want %s, t01", again.GetRunId(), again.GetReusedTaskIds(), err, forkID)
	}
	other := proto.CloneOf(fork)
	other.RemoveTaskIds = []string{"t01"}
	if _, err := o.client.ForkRun(t.Context(), other); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("the key with another fork: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := tenantClient(t, o.addr, "other").ForkRun(t.Context(), fork); status.Code(err) != codes.NotFound {
		t.Errorf("another tenant forks the run: %v, want NOT_FOUND", err)
	}
	// What a fork cannot be: a removed task that another still needs, a
	// max age over 30 days. (A reserved quote starts it: the tenant has no
	// budget, so it covers any run, docs/budget.md#quotes.)
	orphan := &fanoutv1.ForkRunRequest{RunId: srcID, IdempotencyKey: "fork-orphan", RemoveTaskIds: []string{"t00"}}
	if _, err := o.client.ForkRun(t.Context(), orphan); status.Code(err) != codes.InvalidArgument {
		t.Errorf("removing t00, which t02 depends on: %v, want INVALID_ARGUMENT", err)
	}
	reserve := &fanoutv1.ForkRunRequest{RunId: srcID, IdempotencyKey: "fork-reserve", ReserveQuote: true}
	if res, err := o.client.ForkRun(t.Context(), reserve); err != nil || res.GetRunId() == "" || res.GetQuote() == nil {
		t.Errorf("reserve_quote: %v, %v; want a fork started with its quote", res, err)
	}
	tooOld := proto.CloneOf(s)
	tooOld.IdempotencyKey = "too-old"
	tooOld.Cache = &fanoutv1.CacheSettings{TaskMaxAge: durationpb.New(31 * 24 * time.Hour)}
	if _, err := o.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: tooOld}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("task_max_age of 31 days: %v, want INVALID_ARGUMENT", err)
	}
	if n := countRuns(t, o.client) - before; n != 3 {
		t.Errorf("%d runs, want the source and two forks", n)
	}

	// The result cache: the source's spec again, in its tenant, takes every
	// task from it but t01, which wrote: a run of its own makes its writes
	// (docs/budget.md#the-result-cache); in another tenant, none.
	cached := proto.CloneOf(s)
	cached.IdempotencyKey = "cached"
	cached.Cache = &fanoutv1.CacheSettings{TaskMaxAge: durationpb.New(time.Hour)}
	cevs := runAll(t, o.client, cached)
	cachedID := cevs[0].GetRunId()
	cfin := cevs[len(cevs)-1].GetRunFinished()
	if cfin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("cached run ended %s (%s)", cfin.GetState(), cfin.GetCancelCause())
	}
	for _, o := range cfin.GetResult().GetTasks() {
		r := o.GetReused()
		switch {
		case o.GetTaskId() == "t01" && r != nil:
			t.Errorf("cached run's t01, which wrote, reused %v; want it run", r)
		case o.GetTaskId() != "t01" && (r.GetVia() != "cache" || r.GetRunId() != srcID || r.GetTaskId() != o.GetTaskId() || o.GetTokensSpent() != 0):
			t.Errorf("cached run's %s: reused %v, spent %d; want the source's task via cache, 0", o.GetTaskId(), r, o.GetTokensSpent())
		}
	}
	if called := calledTasks(t, w, cachedID); !slices.Equal(called, []string{"t01"}) {
		t.Errorf("the cached run called the model for %q, want t01 only", called)
	}
	if n := runWrites(t, shimDir, cachedID); n == 0 {
		t.Errorf("the cached run sent no write: t01 ran and writes")
	}
	// An entry older than the max age is not taken.
	stale := proto.CloneOf(cached)
	stale.IdempotencyKey = "stale"
	stale.Cache.TaskMaxAge = durationpb.New(time.Millisecond)
	sevs := runAll(t, o.client, stale)
	for _, o := range sevs[len(sevs)-1].GetRunFinished().GetResult().GetTasks() {
		if o.GetReused() != nil {
			t.Errorf("with a 1 ms max age %s reused %v, recorded longer ago", o.GetTaskId(), o.GetReused())
		}
	}
	tenant2 := proto.CloneOf(cached)
	tenant2.TenantId = "other"
	tevs := runAll(t, tenantClient(t, o.addr, "other"), tenant2)
	for _, o := range tevs[len(tevs)-1].GetRunFinished().GetResult().GetTasks() {
		if o.GetReused() != nil {
			t.Errorf("tenant other's %s reused %v: tenants share no entry", o.GetTaskId(), o.GetReused())
		}
	}
	if called := calledTasks(t, w, tevs[0].GetRunId()); !slices.Equal(called, []string{"t00", "t01", "t02"}) {
		t.Errorf("tenant other's run called the model for %q, want every task", called)
	}
}

// runWrites is how many tools/call requests of create_entities the shim
// recorded for run runID (their idempotency keys start with its id).
func runWrites(t *testing.T, shimDir, runID string) int {
	t.Helper()
	n := 0
	for _, r := range readShimRecords(t, shimDir) {
		key, _ := r.Meta[mcp.MetaIdempotencyKey].(string)
		if r.Kind == "request" && r.Tool == "create_entities" && strings.HasPrefix(key, runID+"/") {
			n++
		}
	}
	return n
}

// calledTasks are the tasks of run runID that the worker's sim was called
// for, sorted, each once.
func calledTasks(t *testing.T, w *workerProc, runID string) []string {
	t.Helper()
	var ids []string
	for _, c := range w.calls(t, runID) {
		ids = append(ids, c.TaskID)
	}
	return slices.Compact(slices.Sorted(slices.Values(ids)))
}

// postAs POSTs body (JSON) to url as tenant (--auth none's header) and
// returns the status code and the body.
func postAs(t *testing.T, url, tenant, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(orchestrator.TenantMetadataKey, tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(out)
}

// countRuns is how many runs the caller's tenant has.
func countRuns(t *testing.T, c fanoutv1.OrchestratorServiceClient) int {
	t.Helper()
	resp, err := c.ListRuns(t.Context(), &fanoutv1.ListRunsRequest{PageSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.GetRuns())
}
