package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// curl is what a caller with only curl sends: method, URL, a JSON body
// ("" for none) and a bearer key. It returns the status and the body.
func curl(t *testing.T, method, url, key, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(out)
}

// watchHTTP streams a run's events after after with the Connect protocol's
// server streaming over HTTP/1.1 (an enveloped JSON request, as docs/http.md's
// curl sends it) until the stream ends or stop says so; it returns the
// events and the end-of-stream message.
func watchHTTP(t *testing.T, base, key, runID string, after int64, stop func(*fanoutv1.RunEvent) bool) ([]*fanoutv1.RunEvent, string) {
	t.Helper()
	return streamHTTP(t, base+"/fanout.v1.OrchestratorService/WatchRun", key,
		fmt.Sprintf(`{"runId":%q,"afterSequence":%d}`, runID, after), stop)
}

// streamHTTP calls a server-streaming RPC of OrchestratorService at url
// with the Connect protocol (msg, JSON, enveloped) and returns the events
// of its answers (WatchRunResponse and RunResponse alike hold one event)
// and its end-of-stream message.
func streamHTTP(t *testing.T, url, key, msg string, stop func(*fanoutv1.RunEvent) bool) ([]*fanoutv1.RunEvent, string) {
	t.Helper()
	var env bytes.Buffer
	env.WriteByte(0)
	_ = binary.Write(&env, binary.BigEndian, uint32(len(msg)))
	env.WriteString(msg)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, &env)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		out, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s over HTTP: %d %s", url, resp.StatusCode, out)
	}
	r := bufio.NewReader(resp.Body)
	var events []*fanoutv1.RunEvent
	for {
		var head [5]byte
		if _, err := io.ReadFull(r, head[:]); err != nil {
			t.Fatalf("%s over HTTP: the stream broke after %d events: %v", url, len(events), err)
		}
		body := make([]byte, binary.BigEndian.Uint32(head[1:]))
		if _, err := io.ReadFull(r, body); err != nil {
			t.Fatal(err)
		}
		if head[0]&2 != 0 { // end of stream: {} or {"error":...}
			return events, strings.TrimSpace(string(body))
		}
		var w fanoutv1.WatchRunResponse
		if err := protojson.Unmarshal(body, &w); err != nil {
			t.Fatalf("%s message %q: %v", url, body, err)
		}
		events = append(events, w.GetEvent())
		if stop != nil && stop(w.GetEvent()) {
			return events, ""
		}
	}
}

// TestHTTPForACallerWithOnlyCurl (issue 29): with a key and plain HTTP
// requests (docs/http.md's curl examples), a caller starts a run (REST POST
// /v1/runs), lists it, gets it, watches it streamed (Connect) until its
// budget runs out, resumes the watch from a sequence with no gap and no
// duplicate, reads its tool writes and its spend in money (audit scope),
// cancels a second run, streams a third with Run, lists approvals and
// reads a tenant through AdminService's REST paths with an admin key; bad
// input is 400 naming the field, with nothing written; a missing key is 401
// and a missing scope 403.
func TestHTTPForACallerWithOnlyCurl(t *testing.T) {
	t.Parallel()
	c := startWorkers(t, [][]string{{"--sim-latency", "20ms"}})
	o := startOrchestratorMain(t, c.url, c.workers, "--auth", "keys", "--http-listen", "127.0.0.1:0")
	owner := c.url
	admin(t, owner, "tenant", "create", "acme")
	key := newKey(t, owner, "--tenant", "acme", "--scopes", "run,read,cancel,audit")
	reader := newKey(t, owner, "--tenant", "acme", "--scopes", "read")
	admin(t, owner, "tenant", "create", "globex")
	globex := newKey(t, owner, "--tenant", "globex", "--scopes", "run,read,cancel,audit")
	// A price for the sim model, so that spend has a cost.
	if _, err := c.pool.Exec(t.Context(), `SELECT price_set('role:' || current_user, 'sim', now() - interval '1 day', 3, 15, 'USD', 'test price')`); err != nil {
		t.Fatal(err)
	}
	base := o.http
	spec := e2eSpec("curl-1", 6, 6_000)
	spec.TenantId = "acme"
	for _, task := range spec.GetTasks() {
		task.AllowedTools = []string{"search", "note"} // note is a write: the run has writes to list
	}
	specJSON, err := protojson.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}

	// Quote it first (REST: dry_run is a query parameter): a quote, no run,
	// money at the sim's price (docs/budget.md#quotes; a spec that names
	// its model is priced).
	named := proto.CloneOf(spec)
	named.Model.Model = "sim"
	namedJSON, err := protojson.Marshal(named)
	if err != nil {
		t.Fatal(err)
	}
	code, out := curl(t, "POST", base+"/v1/runs?dryRun=true", key, string(namedJSON))
	var dry fanoutv1.StartRunResponse
	if code != http.StatusOK || protojson.Unmarshal([]byte(out), &dry) != nil || dry.GetRunId() != "" ||
		dry.GetQuote().GetForecastTokens() <= 0 || len(dry.GetQuote().GetCost()) != 1 ||
		dry.GetQuote().GetCost()[0].GetCurrency() != "USD" {
		t.Fatalf("POST /v1/runs?dryRun=true: %d %s; want a quote priced in USD and no run", code, out)
	}

	// Start (REST: the body is the RunSpec).
	code, out = curl(t, "POST", base+"/v1/runs", key, string(specJSON))
	var started struct{ RunID string }
	if code != http.StatusOK || json.Unmarshal([]byte(strings.Replace(out, "runId", "RunID", 1)), &started) != nil || started.RunID == "" {
		t.Fatalf("POST /v1/runs: %d %s", code, out)
	}
	runID := started.RunID

	// Watch until the end: the run meets its budget.
	events, end := watchHTTP(t, base, key, runID, 0, nil)
	if end != "{}" {
		t.Errorf("WatchRun over HTTP ended with %s; want {} (OK)", end)
	}
	last := events[len(events)-1]
	if last.GetRunFinished() == nil || last.GetRunFinished().GetState() != fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED {
		t.Fatalf("last event over HTTP: %v; want RunFinished BUDGET_EXHAUSTED", last)
	}
	for i, e := range events {
		if e.GetSequence() != int64(i+1) {
			t.Fatalf("event %d has sequence %d: a gap or a duplicate", i, e.GetSequence())
		}
	}
	// Resume from the middle: exactly the rest.
	mid := int64(len(events) / 2)
	rest, _ := watchHTTP(t, base, key, runID, mid, nil)
	if len(rest) != len(events)-int(mid) || len(rest) == 0 || rest[0].GetSequence() != mid+1 {
		t.Errorf("WatchRun after_sequence %d: %d events; want %d from %d", mid, len(rest), len(events)-int(mid), mid+1)
	}

	// Get and list (REST).
	code, out = curl(t, "GET", base+"/v1/runs/"+runID, reader, "")
	if code != http.StatusOK || !strings.Contains(out, `"state":"RUN_STATE_BUDGET_EXHAUSTED"`) && !strings.Contains(out, `"state": "RUN_STATE_BUDGET_EXHAUSTED"`) {
		t.Errorf("GET /v1/runs/%s: %d %.300s", runID, code, out)
	}
	code, out = curl(t, "GET", base+"/v1/runs?pageSize=10", reader, "")
	if code != http.StatusOK || !strings.Contains(out, runID) {
		t.Errorf("GET /v1/runs: %d %.300s", code, out)
	}
	code, out = curl(t, "GET", base+"/v1/runs/"+runID+"/tool-calls", reader, "")
	var writes fanoutv1.ListToolCallsResponse
	if code != http.StatusOK || protojson.Unmarshal([]byte(out), &writes) != nil || len(writes.GetCalls()) == 0 {
		t.Errorf("GET /v1/runs/%s/tool-calls: %d %.300s; want the run's note writes", runID, code, out)
	}
	for _, w := range writes.GetCalls() {
		if w.GetTool() != "note" || w.GetCallId() == "" || w.GetCreatedAt() == nil {
			t.Errorf("a write of the run: %v; want a note with its id and time", w)
		}
	}
	// Another tenant sees none of it: not the run's writes, not its spend.
	if code, out = curl(t, "GET", base+"/v1/runs/"+runID+"/tool-calls", globex, ""); code != http.StatusNotFound {
		t.Errorf("globex's GET of acme's run's tool-calls: %d %.300s; want 404", code, out)
	}
	if code, out = curl(t, "GET", base+"/v1/spend?runIds="+runID, globex, ""); code != http.StatusOK ||
		strings.Contains(out, runID) || strings.Contains(out, "USD") {
		t.Errorf("globex's GET /v1/spend naming acme's run: %d %.300s; want nothing of acme's", code, out)
	}
	// Spend in money: audit scope; the reader has none.
	code, out = curl(t, "GET", base+"/v1/spend?runIds="+runID, key, "")
	var spend fanoutv1.GetSpendResponse
	if code != http.StatusOK || protojson.Unmarshal([]byte(out), &spend) != nil {
		t.Fatalf("GET /v1/spend: %d %s", code, out)
	}
	if len(spend.GetDays()) != 1 || spend.GetDays()[0].GetSpend().GetCurrency() != "USD" || spend.GetDays()[0].GetSpend().GetCost() == "0" ||
		len(spend.GetRuns()) != 1 || spend.GetRuns()[0].GetRunId() != runID {
		t.Errorf("GET /v1/spend: %s; want today's USD cost and the run's", out)
	}
	// The same figures as the auditors' view.
	var viewDay, viewCost string
	var viewPriced int64
	if err := c.pool.QueryRow(t.Context(), `SELECT day::text, cost::text, priced_tokens FROM tenant_spend_money_daily
		WHERE tenant_id = 'acme' AND currency = 'USD'`).Scan(&viewDay, &viewCost, &viewPriced); err != nil {
		t.Fatal(err)
	}
	if d := spend.GetDays()[0]; d.GetDay() != viewDay || d.GetSpend().GetCost() != viewCost || d.GetSpend().GetPricedTokens() != viewPriced {
		t.Errorf("GetSpend's day %s: %s USD for %d tokens; tenant_spend_money_daily says %s: %s for %d", d.GetDay(),
			d.GetSpend().GetCost(), d.GetSpend().GetPricedTokens(), viewDay, viewCost, viewPriced)
	}
	if code, out = curl(t, "GET", base+"/v1/spend", reader, ""); code != http.StatusForbidden {
		t.Errorf("GET /v1/spend with a read-only key: %d %s; want 403", code, out)
	}
	// The CLI shows the same, from the same RPCs.
	cli := func(args ...string) string {
		var stdout, stderr bytes.Buffer
		env := func(k string) string {
			if k == "FANOUT_API_KEY" {
				return key
			}
			return ""
		}
		if code := Main(t.Context(), append(args, "--addr", o.addr), &stdout, &stderr, env); code != 0 {
			t.Fatalf("fanout %s: exit %d: %s", strings.Join(args, " "), code, stderr.String())
		}
		return stdout.String()
	}
	if got := cli("spend", "--run", runID); !strings.Contains(got, "USD") || !strings.Contains(got, spend.GetDays()[0].GetSpend().GetCost()) {
		t.Errorf("fanout spend:\n%s\nwant the cost GetSpend gave (%s USD)", got, spend.GetDays()[0].GetSpend().GetCost())
	}
	if got := cli("writes", runID); !strings.Contains(got, "no write") && !strings.Contains(got, "CALL") {
		t.Errorf("fanout writes:\n%s", got)
	}

	// Cancel a second run (REST custom verb); it ends CANCELLED.
	spec2 := e2eSpec("curl-2", 2, 1_000_000)
	spec2.TenantId = "acme"
	long, _ := protojson.Marshal(spec2)
	code, out = curl(t, "POST", base+"/v1/runs", key, string(long))
	if code != http.StatusOK {
		t.Fatalf("POST /v1/runs: %d %s", code, out)
	}
	var s2 fanoutv1.StartRunResponse
	if err := protojson.Unmarshal([]byte(out), &s2); err != nil {
		t.Fatal(err)
	}
	code, out = curl(t, "POST", base+"/v1/runs/"+s2.GetRunId()+":cancel", key, `{"reason":"from curl"}`)
	if code != http.StatusOK {
		t.Errorf("POST /v1/runs/%s:cancel: %d %.300s", s2.GetRunId(), code, out)
	}
	events, _ = watchHTTP(t, base, key, s2.GetRunId(), 0, nil)
	if f := events[len(events)-1].GetRunFinished(); f.GetState() != fanoutv1.RunState_RUN_STATE_CANCELLED {
		t.Errorf("the cancelled run finished %v; want CANCELLED", f)
	}
	if code, out = curl(t, "GET", base+"/v1/runs/"+s2.GetRunId(), key, ""); !strings.Contains(out, "cancelled by caller: from curl") {
		t.Errorf("GET the cancelled run: %d %.300s; want its cause", code, out)
	}

	// Continue (REST): a key is required; a cancelled run is not
	// continued; the run that met its budget greedily has no task left
	// NOT_STARTED, so a continuation would run nothing (docs/budget.md#continue).
	for _, c := range []struct{ run, body, want string }{
		{runID, `{"addTokens":"1000"}`, "idempotency_key"},
		{s2.GetRunId(), `{"addTokens":"1000","idempotencyKey":"k"}`, "fork it instead"},
		{runID, `{"addTokens":"1000","idempotencyKey":"k"}`, "would run nothing again"},
	} {
		if code, out = curl(t, "POST", base+"/v1/runs/"+c.run+":continue", key, c.body); code != http.StatusBadRequest ||
			!strings.Contains(out, c.want) {
			t.Errorf("POST /v1/runs/%s:continue %s: %d %.300s; want 400 naming %q", c.run, c.body, code, out, c.want)
		}
	}

	// Run, streamed (Connect): RunStarted first, RunFinished last.
	spec3 := e2eSpec("curl-3", 2, 1_000_000)
	spec3.TenantId = "acme"
	runJSON, _ := protojson.Marshal(&fanoutv1.RunRequest{Spec: spec3})
	events, end = streamHTTP(t, base+"/fanout.v1.OrchestratorService/Run", key, string(runJSON), nil)
	if end != "{}" || events[0].GetRunStarted() == nil || events[len(events)-1].GetRunFinished() == nil {
		t.Errorf("Run over HTTP: %d events ending %q; want RunStarted … RunFinished, then {}", len(events), end)
	}
	// Approvals (REST): none waits; another tenant's call id is 404.
	approver := newKey(t, owner, "--tenant", "acme", "--scopes", "approve")
	if code, out := curl(t, "GET", base+"/v1/approvals?runId="+runID, approver, ""); code != http.StatusOK || !strings.Contains(out, `"calls":[]`) {
		t.Errorf("GET /v1/approvals: %d %.300s; want none", code, out)
	}
	if code, out := curl(t, "POST", base+"/v1/approvals/tc_00000000000000000000000000000000:approve", approver, `{"reason":"x"}`); code != http.StatusNotFound {
		t.Errorf("POST /v1/approvals/…:approve of no call: %d %.300s; want 404", code, out)
	}
	// AdminService (REST) with an admin key; a tenant key is 403 there.
	adminKey := newKey(t, owner, "--admin", "--name", "ops")
	if code, out := curl(t, "GET", base+"/v1/admin/tenants/acme", adminKey, ""); code != http.StatusOK || !strings.Contains(out, `"acme"`) {
		t.Errorf("GET /v1/admin/tenants/acme with an admin key: %d %.300s", code, out)
	}
	if code, out := curl(t, "GET", base+"/v1/admin/keys?tenantId=acme", key, ""); code != http.StatusForbidden {
		t.Errorf("GET /v1/admin/keys with a tenant key: %d %.300s; want 403", code, out)
	}

	// Bad input, no key, no scope: nothing written.
	var before int
	if err := c.pool.QueryRow(t.Context(), `SELECT count(*) FROM run`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	for _, cs := range []struct {
		name, method, path, key, body string
		code                          int
		want                          string
	}{
		{"no tasks", "POST", "/v1/runs", key, `{"idempotencyKey":"bad","goal":"g","budget":{"limitTokens":"100"}}`, 400, "spec.tasks"},
		{"negative page size", "GET", "/v1/runs?pageSize=-1", key, "", 400, "page_size"},
		{"malformed day", "GET", "/v1/spend?fromDay=yesterday", key, "", 400, "from_day"},
		{"year zero", "GET", "/v1/spend?fromDay=0000-01-01&toDay=0000-01-02", key, "", 400, "from_day"},
		{"a range too long", "GET", "/v1/spend?fromDay=2020-01-01&toDay=2026-01-01", key, "", 400, "366"},
		{"unknown field", "POST", "/v1/runs", key, `{"nope":1}`, 400, ""},
		{"no key", "POST", "/v1/runs", "", string(specJSON), 401, `"code":16`},
		{"no run scope", "POST", "/v1/runs", reader, string(specJSON), 403, "scope"},
		// REST answers errors as google.rpc.Status JSON (numeric codes).
		{"an unknown run id", "GET", "/v1/runs/00000000-0000-0000-0000-000000000000", key, "", 404, "run not found"},
	} {
		code, out := curl(t, cs.method, base+cs.path, cs.key, cs.body)
		if code != cs.code || !strings.Contains(out, cs.want) {
			t.Errorf("%s (%s %s): %d %.300s; want %d naming %q", cs.name, cs.method, cs.path, code, out, cs.code, cs.want)
		}
	}
	var after int
	if err := c.pool.QueryRow(t.Context(), `SELECT count(*) FROM run`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("refused calls wrote %d runs", after-before)
	}
}
