package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/mcp"
)

// plantedSecrets are what secretServer puts in its tools' arguments (as
// the schemas' consts, which the sim model sends), results and errors, in
// the forms the redaction rule knows: a secret-looking name's value, a
// bearer header, a key prefix, a URL's password.
var plantedSecrets = []string{
	"pw-arg-Q7", "tok-arg-Q7", "key-arg-Q7", "argQ7abcdefgh", // every tool's arguments
	"pw-res-Q7", "tok-res-Q7", "key-res-Q7", "resQ7abcdefgh", "pw-url-Q7", // lookup's result
	"key-fail-Q7", "tok-fail-Q7", // lookup_fail's error result
	"tok-boom-Q7", "pw-boom-Q7", // lookup_boom's protocol error
	"pw-send-Q7", "sendQ7abcdefgh", // send's error result (a write)
}

// secretServer is an MCP server over streamable HTTP whose four tools
// plant secrets: lookup (read) returns them, lookup_fail (read) returns
// them as an error result, lookup_boom (read) fails with them as a
// protocol error, send (a write, approved first) returns them as an error
// result. Every call's arguments hold secrets too. It records the
// arguments it was sent.
type secretServer struct {
	*httptest.Server
	mu   sync.Mutex
	args []string
}

func newSecretServer(t *testing.T) *secretServer {
	t.Helper()
	s := &secretServer{}
	srv := sdk.NewServer(&sdk.Implementation{Name: "vault", Version: "1"}, nil)
	schema := json.RawMessage(`{"type":"object","properties":{
		"password":{"type":"string","const":"pw-arg-Q7"},
		"header":{"type":"string","const":"Authorization: Bearer tok-arg-Q7"},
		"api_key":{"type":"string","const":"key-arg-Q7"},
		"note":{"type":"string","const":"deploy with sk-live-argQ7abcdefgh"}},
		"required":["password","header","api_key","note"]}`)
	text := func(s string) *sdk.CallToolResult {
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: s}}}
	}
	tool := func(name string, h func() (*sdk.CallToolResult, error)) {
		srv.AddTool(&sdk.Tool{Name: name, InputSchema: schema}, func(_ context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			s.mu.Lock()
			s.args = append(s.args, string(req.Params.Arguments))
			s.mu.Unlock()
			return h()
		})
	}
	tool("lookup", func() (*sdk.CallToolResult, error) {
		return text("found: password=pw-res-Q7, Authorization: Bearer tok-res-Q7, api_key: key-res-Q7, " +
			"sk-live-resQ7abcdefgh, at https://admin:pw-url-Q7@db.example/x"), nil
	})
	tool("lookup_fail", func() (*sdk.CallToolResult, error) {
		r := text(`denied: {"api_key":"key-fail-Q7"} with Bearer tok-fail-Q7`)
		r.IsError = true
		return r, nil
	})
	tool("lookup_boom", func() (*sdk.CallToolResult, error) {
		return nil, errors.New("backend said token=tok-boom-Q7 password=pw-boom-Q7")
	})
	tool("send", func() (*sdk.CallToolResult, error) {
		r := text("refused: password=pw-send-Q7 sk-live-sendQ7abcdefgh")
		r.IsError = true
		return r, nil
	})
	s.Server = httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, nil))
	t.Cleanup(func() {
		for ss := range srv.Sessions() {
			_ = ss.Close()
		}
		s.Close()
	})
	return s
}

// TestToolSecretsAreRedactedEverywhere (issue 40, item 4): secrets in a
// tool call's arguments, its result and its errors (an error result, a
// protocol error, a write's failure) reach no surface a caller or an
// operator reads: WatchRun's events, GetRun, ListApprovals' preview,
// ListToolCalls, and the worker's and the orchestrator's logs. The model
// still sends them and the tool still receives them; the summary still
// names every call and every failure.
func TestToolSecretsAreRedactedEverywhere(t *testing.T) {
	t.Parallel()
	srv := newSecretServer(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("vault-test-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	config := writeYAML(t, dir, "mcp.yaml", map[string]any{"servers": []any{map[string]any{
		"name": "vault", "transport": "http", "url": srv.URL, "token_file": "token", "call_timeout": "60s",
		"tools": []any{
			map[string]any{"name": "lookup", "effect": "read"},
			map[string]any{"name": "lookup_fail", "effect": "read"},
			map[string]any{"name": "lookup_boom", "effect": "read"},
			map[string]any{"name": "send", "effect": "write", "approval": "required", "approval_timeout": "2m"},
		},
	}}})
	// The first reply calls each of the four tools once; the second answers.
	c := newCluster(t, [][]string{{"--mcp-config", config, "--sim-tool-calls", "4", "--sim-finish-after", "2",
		"--sim-latency", "10ms"}}, "--mcp-config", config)
	client := c.orch.client

	s := e2eSpec("redact", 1, 1_000_000)
	s.Tasks[0].AllowedTools = []string{mcp.ModelName("vault", "lookup"), mcp.ModelName("vault", "lookup_fail"),
		mcp.ModelName("vault", "lookup_boom"), mcp.ModelName("vault", "send")}
	started, err := client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := started.GetRunId()
	stream, err := client.WatchRun(t.Context(), &fanoutv1.WatchRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	evs := make(chan *fanoutv1.RunEvent, 64)
	go func() {
		defer close(evs)
		for {
			resp, err := stream.Recv()
			if err != nil {
				if !errors.Is(err, io.EOF) && t.Context().Err() == nil {
					t.Errorf("watch %s: %v", runID, err)
				}
				return
			}
			evs <- resp.GetEvent()
		}
	}()
	var events []*fanoutv1.RunEvent
	seen := func(ev *fanoutv1.RunEvent) { events = append(events, ev) }
	asked := next(t, evs, "ApprovalRequested", func(ev *fanoutv1.RunEvent) bool { seen(ev); return isApproval(ev) })

	// Each surface, as a caller reads it.
	surfaces := map[string]string{}
	read := func(name string, m proto.Message) {
		b, err := protojson.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		surfaces[name] += string(b) + "\n"
	}
	approvals, err := client.ListApprovals(t.Context(), &fanoutv1.ListApprovalsRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(approvals.GetCalls()); n != 1 || approvals.GetCalls()[0].GetPreview() == "" {
		t.Fatalf("ListApprovals: %v; want send's call with its preview", approvals)
	}
	read("ListApprovals", approvals)
	if _, err := client.ApproveToolCall(t.Context(), &fanoutv1.ApproveToolCallRequest{
		CallId: asked.GetApprovalRequested().GetCallId(), Reason: "ok"}); err != nil {
		t.Fatal(err)
	}
	fin := next(t, evs, "RunFinished", func(ev *fanoutv1.RunEvent) bool { seen(ev); return isFinish(ev) }).GetRunFinished()
	for _, ev := range events {
		read("WatchRun", ev)
	}
	run, err := client.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	read("GetRun", run)
	calls, err := client.ListToolCalls(t.Context(), &fanoutv1.ListToolCallsRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	read("ListToolCalls", calls)
	surfaces["worker log"] = c.workers[0].logs.all()
	surfaces["orchestrator log"] = c.orch.logs.all()

	// The secrets went where they should: to the tool, and the calls and
	// their failures are all in the summary and the write log.
	srv.mu.Lock()
	sent := srv.args
	srv.mu.Unlock()
	if len(sent) != 4 {
		t.Fatalf("the server got %d calls (%q); want the four tools once each", len(sent), sent)
	}
	for _, a := range sent {
		if !strings.Contains(a, "pw-arg-Q7") || !strings.Contains(a, "Bearer tok-arg-Q7") {
			t.Errorf("the server got %s; want the planted secrets as sent", a)
		}
	}
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED || len(fin.GetResult().GetTasks()) != 1 {
		t.Fatalf("run ended %s (%s); want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	sum := fin.GetResult().GetTasks()[0].GetSummary()
	if len(sum.GetTried()) != 4 || len(sum.GetFailed()) != 3 {
		t.Errorf("tried %q, failed %q; want the four calls tried, lookup_fail, lookup_boom and send failed",
			sum.GetTried(), sum.GetFailed())
	}
	var urls int
	for _, f := range sum.GetFacts() {
		for _, src := range f.GetSources() {
			if strings.HasPrefix(src, "https://") {
				urls++
			}
		}
	}
	if urls == 0 {
		t.Errorf("facts %v; want lookup's URL as a source", sum.GetFacts())
	}
	if len(calls.GetCalls()) != 1 || calls.GetCalls()[0].GetState() != "failed" || calls.GetCalls()[0].GetError() == "" {
		t.Errorf("ListToolCalls: %v; want send, failed, with its error", calls)
	}

	for name, text := range surfaces {
		for _, secret := range plantedSecrets {
			if i := strings.Index(text, secret); i >= 0 {
				t.Errorf("%s shows %s: …%s…", name, secret, text[max(0, i-120):min(len(text), i+40)])
			}
		}
	}
	if t.Failed() {
		for _, tried := range sum.GetTried() {
			t.Logf("tried: %s", tried)
		}
		for _, failed := range sum.GetFailed() {
			t.Logf("failed: %s", failed)
		}
		t.Logf("ListToolCalls: %s", surfaces["ListToolCalls"])
	}
}
