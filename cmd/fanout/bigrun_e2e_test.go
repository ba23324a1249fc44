package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// bigRunTasks is the size of the run that outgrew gRPC's default 4 MiB
// receive limit (issue 44).
const bigRunTasks = 10_000

// TestTenThousandTasksReadableByAnyClient (issue 44, part 3): a run of
// 10,000 one-call sim tasks, read by clients with default settings. Its
// GetRun, CancelRun and every WatchRun event (RunStarted, RunFinished
// included) are each under orchestrator.MaxResponseBytes, over a gRPC
// client with the default 4 MiB receive limit; paging ListRunTasks and
// ListRunFacts from the tokens they carry gives every task exactly once in
// dispatch order and exactly the result's facts, over gRPC and over
// REST; `fanout get --json` and `fanout watch --json` print the run and its
// result whole.
func TestTenThousandTasksReadableByAnyClient(t *testing.T) {
	one := []string{"--sim-latency", "1ms", "--sim-finish-after", "1", "--sim-tool-calls", "0", "--sim-output-tokens", "40"}
	c := startWorkers(t, [][]string{one, one})
	o := startOrchestratorMain(t, c.url, c.workers, "--max-tasks", fmt.Sprint(bigRunTasks), "--max-concurrency", "400",
		"--http-listen", "127.0.0.1:0")
	spec := &fanoutv1.RunSpec{IdempotencyKey: "ten-thousand", TenantId: "e2e", Goal: "find facts",
		Budget: &fanoutv1.Budget{LimitTokens: 100_000_000, Admission: fanoutv1.AdmissionPolicy_ADMISSION_POLICY_GREEDY},
		Limits: &fanoutv1.Limits{MaxConcurrency: 400}, Model: &fanoutv1.ModelSettings{Provider: "sim", MaxOutputTokens: 64}}
	for i := range bigRunTasks {
		spec.Tasks = append(spec.Tasks, &fanoutv1.TaskSpec{Id: fmt.Sprintf("t%05d", i),
			Instruction: fmt.Sprintf("look up item %d", i), TokenBudget: 20_000, MaxIterations: 1})
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	client := o.client // grpc.NewClient's defaults: a 4 MiB receive limit
	start := time.Now()
	started, err := client.StartRun(ctx, &fanoutv1.StartRunRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	runID := started.GetRunId()
	stream, err := client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	var events, largest int
	var end *fanoutv1.RunEvent
	for end == nil {
		m, err := stream.Recv()
		if status.Code(err) == codes.ResourceExhausted && events > 0 {
			// A reader left behind (slow under -race) resumes where it was,
			// as the API says.
			t.Logf("WatchRun after %d events: %v; resuming", events, err)
			if stream, err = client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID, AfterSequence: int64(events)}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("WatchRun after %d events: %v", events, err)
		}
		if m.GetEvent().GetSequence() != int64(events)+1 {
			t.Fatalf("WatchRun: event %d after %d", m.GetEvent().GetSequence(), events)
		}
		events++
		if n := proto.Size(m); n > orchestrator.MaxResponseBytes {
			t.Errorf("WatchRun event %d (%T): %d bytes, over %d", m.GetEvent().GetSequence(), m.GetEvent().GetEvent(), n, orchestrator.MaxResponseBytes)
		} else if n > largest {
			largest = n
		}
		if m.GetEvent().GetRunStarted() != nil || m.GetEvent().GetRunFinished() != nil {
			t.Logf("%T: %d bytes", m.GetEvent().GetEvent(), proto.Size(m))
		}
		if m.GetEvent().GetRunFinished() != nil {
			end = m.GetEvent()
		}
	}
	t.Logf("run of %d tasks ended %s in %v; %d events, the largest %d bytes", bigRunTasks,
		end.GetRunFinished().GetState(), time.Since(start).Round(time.Millisecond), events, largest)
	if end.GetRunFinished().GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("run ended %s: %s", end.GetRunFinished().GetState(), end.GetRunFinished().GetCancelCause())
	}

	got, err := client.GetRun(ctx, &fanoutv1.GetRunRequest{RunId: runID})
	if err != nil {
		t.Fatalf("GetRun with a default client: %v", err)
	}
	cancelled, err := client.CancelRun(ctx, &fanoutv1.CancelRunRequest{RunId: runID, Reason: "ended already"})
	if err != nil {
		t.Fatalf("CancelRun with a default client: %v", err)
	}
	for name, m := range map[string]proto.Message{"GetRun": got, "CancelRun": cancelled} {
		t.Logf("%s: %d bytes", name, proto.Size(m))
		if n := proto.Size(m); n > orchestrator.MaxResponseBytes {
			t.Errorf("%s: %d bytes, over %d", name, n, orchestrator.MaxResponseBytes)
		}
	}
	run := got.GetRun()
	res := run.GetResult()
	if run.GetTaskCount() != bigRunTasks || res.GetTaskCount() != bigRunTasks || run.GetTasksNextPageToken() == "" ||
		res.GetTasksNextPageToken() == "" || res.GetFactsNextPageToken() == "" {
		t.Errorf("GetRun: %d of %d tasks (token %v), result %d of %d, %d of %d facts; want a cut run of %d tasks",
			len(run.GetTasks()), run.GetTaskCount(), run.GetTasksNextPageToken() != "", len(res.GetTasks()), res.GetTaskCount(),
			len(res.GetFacts()), res.GetFactCount(), bigRunTasks)
	}

	// Over gRPC, from the tokens GetRun gave: every task once, in order.
	checkTasks := func(how string, tasks []*fanoutv1.TaskOutcome) {
		t.Helper()
		if len(tasks) != bigRunTasks {
			t.Errorf("%s: %d tasks, want %d", how, len(tasks), bigRunTasks)
			return
		}
		for i, o := range tasks {
			if int(o.GetDispatchIndex()) != i || o.GetTaskId() != spec.GetTasks()[i].GetId() ||
				o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
				t.Errorf("%s: task %d is %s (#%d, %s)", how, i, o.GetTaskId(), o.GetDispatchIndex(), o.GetStatus())
				return
			}
		}
	}
	whole := proto.CloneOf(run)
	if err := completeRun(ctx, pageChecker{t, client}, whole); err != nil {
		t.Fatal(err)
	}
	checkTasks("GetRun's tasks and ListRunTasks' pages", whole.GetTasks())
	checkTasks("GetRun's result's tasks and ListRunTasks' pages", whole.GetResult().GetTasks())
	facts := whole.GetResult().GetFacts()
	if len(facts) != int(res.GetFactCount()) || len(facts) == 0 {
		t.Errorf("facts paged: %d, fact_count %d", len(facts), res.GetFactCount())
	}
	var stored int
	if err := c.pool.QueryRow(ctx, `SELECT jsonb_array_length(result->'facts') FROM run WHERE run_id = $1`, runID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range facts {
		seen[f.GetText()] = true
	}
	if stored != len(facts) || len(seen) != len(facts) {
		t.Errorf("facts paged: %d (%d distinct); the stored result has %d", len(facts), len(seen), stored)
	}
	t.Logf("the run whole: %d bytes (%d tasks, %d facts); GetRun served %d tasks, %d result tasks, %d facts",
		proto.Size(whole), bigRunTasks, len(facts), len(run.GetTasks()), len(res.GetTasks()), len(res.GetFacts()))

	// RunFinished's result, completed the same way, is GetRun's.
	if err := completeResult(ctx, client, runID, end.GetRunFinished().GetResult()); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(end.GetRunFinished().GetResult(), whole.GetResult()) {
		t.Errorf("RunFinished's result paged differs from GetRun's paged")
	}

	// Over REST (curl's view): the run, then its pages.
	var restGot fanoutv1.GetRunResponse
	restGet(t, o.http, "/v1/runs/"+runID, &restGot)
	if restRun := restGot.GetRun(); restRun.GetTaskCount() != bigRunTasks || restRun.GetTasksNextPageToken() == "" {
		t.Errorf("GET /v1/runs/ID: %d of %d tasks; want a cut run of %d", len(restRun.GetTasks()), restRun.GetTaskCount(), bigRunTasks)
	}
	var restTasks []*fanoutv1.TaskOutcome
	for token := ""; ; {
		var page fanoutv1.ListRunTasksResponse
		restGet(t, o.http, "/v1/runs/"+runID+"/tasks?pageSize=1000&pageToken="+url.QueryEscape(token), &page)
		restTasks = append(restTasks, page.GetTasks()...)
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	checkTasks("GET /v1/runs/ID/tasks", restTasks)
	var restFacts int
	for token := ""; ; {
		var page fanoutv1.ListRunFactsResponse
		restGet(t, o.http, "/v1/runs/"+runID+"/facts?pageSize=1000&pageToken="+url.QueryEscape(token), &page)
		restFacts += len(page.GetFacts())
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	if restFacts != len(facts) {
		t.Errorf("GET /v1/runs/ID/facts: %d facts, want %d", restFacts, len(facts))
	}

	// Page sizes: 0 is the default (100), above the maximum is lowered to
	// it (1,000); a token is its listing's own.
	for asked, want := range map[string]int{"0": 100, "1000": 1000, "5000": 1000, "7": 7} {
		var page fanoutv1.ListRunTasksResponse
		restGet(t, o.http, "/v1/runs/"+runID+"/tasks?pageSize="+asked, &page)
		if len(page.GetTasks()) != want || page.GetTaskCount() != bigRunTasks {
			t.Errorf("ListRunTasks pageSize %s: %d tasks of %d, want %d", asked, len(page.GetTasks()), page.GetTaskCount(), want)
		}
	}
	if _, err := client.ListRunTasks(ctx, &fanoutv1.ListRunTasksRequest{RunId: runID, PageToken: res.GetFactsNextPageToken()}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("ListRunTasks with ListRunFacts' token: %v, want INVALID_ARGUMENT", err)
	}
	// A token whose position is past any run's (forged by its own tenant:
	// tokens are not signed) is the caller's mistake, not an internal error.
	var forged map[string]any
	if raw, err := base64.RawURLEncoding.DecodeString(res.GetFactsNextPageToken()); err != nil || json.Unmarshal(raw, &forged) != nil {
		t.Fatalf("the facts token %q is not base64 JSON", res.GetFactsNextPageToken())
	}
	forged["n"] = int64(1) << 62
	raw, err := json.Marshal(forged)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.ListRunFacts(ctx, &fanoutv1.ListRunFactsRequest{RunId: runID, PageToken: base64.RawURLEncoding.EncodeToString(raw)}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("ListRunFacts with a token at 2^62: %v, want INVALID_ARGUMENT", err)
	}

	// The CLI prints it whole.
	cli := func(args ...string) []byte {
		t.Helper()
		var out, errOut bytes.Buffer
		if code := Main(ctx, append(args, "--addr", o.addr, "--tenant", "e2e", "--json"), &out, &errOut,
			func(string) string { return "" }); code != 0 {
			t.Fatalf("fanout %v exited %d: %s", args, code, errOut.String())
		}
		return out.Bytes()
	}
	var printed fanoutv1.Run
	if err := protojson.Unmarshal(cli("get", runID), &printed); err != nil {
		t.Fatalf("fanout get --json: %v", err)
	}
	checkTasks("fanout get --json", printed.GetTasks())
	checkTasks("fanout get --json's result", printed.GetResult().GetTasks())
	if len(printed.GetResult().GetFacts()) != len(facts) || printed.GetTasksNextPageToken() != "" {
		t.Errorf("fanout get --json: %d facts, want %d", len(printed.GetResult().GetFacts()), len(facts))
	}
	// From near the end: the events before are the stream's, tested above
	// (a CLI replaying 40,000 of them under -race falls behind the server's
	// lag rule).
	lines := bytes.Split(bytes.TrimSpace(cli("watch", runID, "--after", fmt.Sprint(events-3))), []byte("\n"))
	var last fanoutv1.RunEvent
	if err := protojson.Unmarshal(lines[len(lines)-1], &last); err != nil {
		t.Fatalf("fanout watch --json's last line: %v", err)
	}
	checkTasks("fanout watch --json's RunFinished", last.GetRunFinished().GetResult().GetTasks())
	if len(last.GetRunFinished().GetResult().GetFacts()) != len(facts) {
		t.Errorf("fanout watch --json's RunFinished: %d facts, want %d", len(last.GetRunFinished().GetResult().GetFacts()), len(facts))
	}
}

// restGet GETs path of the orchestrator's HTTP listener at base as JSON
// into m.
func restGet(t *testing.T, base, path string, m proto.Message) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(orchestrator.TenantMetadataKey, "e2e") // --auth none: the caller names its tenant
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var raw json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v %.300s", path, resp.StatusCode, err, raw)
	}
	if err := protojson.Unmarshal(raw, m); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}

// pageChecker is a client whose ListRunTasks and ListRunFacts pages are
// each checked under the cap.
type pageChecker struct {
	t *testing.T
	fanoutv1.OrchestratorServiceClient
}

func (c pageChecker) ListRunTasks(ctx context.Context, in *fanoutv1.ListRunTasksRequest, opts ...grpc.CallOption) (*fanoutv1.ListRunTasksResponse, error) {
	page, err := c.OrchestratorServiceClient.ListRunTasks(ctx, in, opts...)
	if n := proto.Size(page); n > orchestrator.MaxResponseBytes {
		c.t.Errorf("a ListRunTasks page of %d tasks: %d bytes, over %d", len(page.GetTasks()), n, orchestrator.MaxResponseBytes)
	}
	return page, err
}

func (c pageChecker) ListRunFacts(ctx context.Context, in *fanoutv1.ListRunFactsRequest, opts ...grpc.CallOption) (*fanoutv1.ListRunFactsResponse, error) {
	page, err := c.OrchestratorServiceClient.ListRunFacts(ctx, in, opts...)
	if n := proto.Size(page); n > orchestrator.MaxResponseBytes {
		c.t.Errorf("a ListRunFacts page of %d facts: %d bytes, over %d", len(page.GetFacts()), n, orchestrator.MaxResponseBytes)
	}
	return page, err
}
