package main

// A bad MCP config stops a node before it serves, with an error naming the
// entry; and an HTTP server's bearer token never reaches a worker's logs.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent/llm/llmtest"
)

// mcpHTTPServer is an MCP server of the SDK's, served over streamable HTTP
// on loopback by this test process: tools echo (no annotations) and wipe
// (annotated destructiveHint: true).
type mcpHTTPServer struct {
	url        string
	token      string       // the bearer token it requires, "" for none
	refuse     atomic.Int32 // accept (0), refusePlainly or refuseQuoting every request
	authorized atomic.Int64
	toolCalls  atomic.Int64
}

func startMCPHTTP(t *testing.T, token string) *mcpHTTPServer {
	t.Helper()
	m := &mcpHTTPServer{token: token}
	srv := sdk.NewServer(&sdk.Implementation{Name: "fanout-test", Version: "1"}, nil)
	object := json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`)
	srv.AddTool(&sdk.Tool{Name: "echo", Description: "Echo the text.", InputSchema: object},
		func(_ context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			m.toolCalls.Add(1)
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "echo: " + string(req.Params.Arguments)}}}, nil
		})
	destructive := true
	srv.AddTool(&sdk.Tool{Name: "wipe", Description: "Delete everything.", InputSchema: object,
		Annotations: &sdk.ToolAnnotations{DestructiveHint: &destructive}},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			m.toolCalls.Add(1)
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "wiped"}}}, nil
		})
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, nil)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		switch m.refuse.Load() {
		case refusePlainly:
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		case refuseQuoting:
			// A server that quotes the credential it refuses, as some do,
			// in a JSON-RPC error answering the request (the SDK shows its
			// message): the worker must not pass it on.
			var msg struct {
				ID json.RawMessage `json:"id"`
			}
			_ = json.NewDecoder(r.Body).Decode(&msg) // Without an id, the answer has none either.
			if len(msg.ID) == 0 {
				msg.ID = json.RawMessage("null")
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32001,"message":"token %s is revoked"}}`, msg.ID, got)
			return
		}
		if m.token != "" && got != m.token {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		m.authorized.Add(1)
		h.ServeHTTP(w, r)
	}))
	m.url = hs.URL + "/mcp"
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		for ss := range srv.Sessions() {
			_ = ss.Close() // a worker that exited left its session open here
		}
	})
	return m
}

// How an mcpHTTPServer refuses every request once told to.
const (
	refusePlainly = 1 // 401 "unauthorized"
	refuseQuoting = 2 // 401 with a JSON-RPC error quoting the token it was sent
)

// workerExit runs `fanout worker --mcp-config cfg` as a process of its own
// (this test binary, re-executed) and returns its stderr once it exited,
// failing the test if it served, exited 0, or did not exit within a minute.
func workerExit(t *testing.T, databaseURL, name, cfg string) string {
	t.Helper()
	f := testPeer(t)
	raw, err := json.Marshal([]string{"worker", "--listen", "127.0.0.1:0", "--database-url", storetest.NodeURL(t, databaseURL),
		"--name", name, "--log-level", "info",
		"--peer-tls-ca", f.CA, "--peer-tls-cert", f.Worker.Cert, "--peer-tls-key", f.Worker.Key,
		"--peer-verify-keys", f.VerifyKey, "--mcp-config", cfg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envE2EArgs+"="+string(raw))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr, stdout lockedBuffer
	cmd.Stderr, cmd.Stdout = &stderr, &stdout
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("worker %s did not exit within a minute:\n%s", name, stderr.String())
	case err == nil:
		t.Fatalf("worker %s exited 0 with a bad --mcp-config, want non-zero:\n%s", name, stderr.String())
	case !errors.As(err, &exit):
		t.Fatalf("run worker %s: %v", name, err)
	}
	if strings.Contains(stderr.String(), "worker serving") {
		t.Errorf("worker %s served before it exited %d:\n%s", name, exit.ExitCode(), stderr.String())
	}
	return stderr.String()
}

// orchestratorExit runs `fanout orchestrator --mcp-config cfg` (Main, in
// this process) and returns its stderr, failing the test unless it exits
// non-zero within 30 s.
func orchestratorExit(t *testing.T, databaseURL, cfg string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	args := orchestratorArgs(t, databaseURL, []*workerProc{{addr: "127.0.0.1:1"}}, "--mcp-config", cfg)
	var stdout, stderr lockedBuffer
	done := make(chan int, 1)
	go func() { done <- Main(ctx, args, &stdout, &stderr, testGetenv) }()
	select {
	case code := <-done:
		if code == 0 {
			t.Errorf("orchestrator exited 0 with a bad --mcp-config, want non-zero:\n%s", stderr.String())
		}
		if strings.Contains(stderr.String(), "orchestrator serving") {
			t.Errorf("orchestrator served before it exited:\n%s", stderr.String())
		}
	case <-time.After(30 * time.Second):
		cancel()
		<-done
		t.Fatalf("orchestrator still running 30s after it was given a bad --mcp-config:\n%s", stderr.String())
	}
	return stderr.String()
}

// orchestratorKnows starts `fanout orchestrator --mcp-config cfg` and
// checks that it serves and offers tool: a task allowing a tool nobody
// configured is refused with a list of the known ones, which must hold it.
func orchestratorKnows(t *testing.T, databaseURL, cfg, tool string) {
	t.Helper()
	o := startOrchestratorMain(t, databaseURL, []*workerProc{{addr: "127.0.0.1:1"}}, "--mcp-config", cfg)
	s := e2eSpec("probe-"+tool, 1, 100_000)
	s.Tasks[0].AllowedTools = []string{"nobody__configured_this"}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := o.client.Run(ctx, &fanoutv1.RunRequest{Spec: s})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "nobody__configured_this") {
		t.Fatalf("Run with an unknown tool = %v, want InvalidArgument naming it", err)
	}
	if !strings.Contains(err.Error(), tool) {
		t.Errorf("the orchestrator does not know the configured tool %s: %v", tool, err)
	}
}

// TestMCPBadConfigNodeDoesNotStart: for each bad MCP config, a worker
// process exits non-zero before it serves, its stderr naming the entry;
// the orchestrator, which only parses the file (it connects to no server
// and need not have the servers' secrets), refuses what parsing finds and
// serves, knowing the tools, where only a worker can tell.
func TestMCPBadConfigNodeDoesNotStart(t *testing.T) {
	t.Parallel()
	url := storetest.NewDB(t)
	srv := startMCPHTTP(t, "")
	dir := t.TempDir()
	long := strings.Repeat("x", 62) // "s__" + 62 characters is 65, over the providers' 64
	cases := []struct {
		name   string
		config string
		worker []string // what the worker's stderr must hold
		// orchestrator is what its stderr must hold; empty: it serves and
		// knows the tool orchestratorTool.
		orchestrator     []string
		orchestratorTool string
	}{{
		name: "unknown transport",
		config: `servers:
  - name: pigeon
    transport: carrier-pigeon
    command: coo
    tools: [{name: deliver, effect: write}]`,
		worker:       []string{`servers[0] (pigeon).transport: "carrier-pigeon" is not stdio or http`},
		orchestrator: []string{`servers[0] (pigeon).transport: "carrier-pigeon" is not stdio or http`},
	}, {
		name: "missing secret file",
		config: `servers:
  - name: vault
    transport: http
    url: ` + srv.url + `
    token_file: ` + filepath.Join(dir, "no-such-token") + `
    tools: [{name: echo, effect: read}]`,
		worker:           []string{"servers[0] (vault).token_file: read " + filepath.Join(dir, "no-such-token") + ": no such file or directory"},
		orchestratorTool: "vault__echo",
	}, {
		name: "tool name the providers refuse",
		config: `servers:
  - name: memory
    transport: stdio
    command: node
    tools: [{name: "bad name!", effect: read}]`,
		worker:       []string{`servers[0] (memory).tools[0] (bad name!): model-facing name "memory__bad name!" must match`},
		orchestrator: []string{`servers[0] (memory).tools[0] (bad name!): model-facing name "memory__bad name!" must match`},
	}, {
		name: "model-facing name over 64",
		config: `servers:
  - name: s
    transport: stdio
    command: node
    tools: [{name: ` + long + `, effect: read}]`,
		worker:       []string{`servers[0] (s).tools[0] (` + long + `): model-facing name "s__` + long + `"`, "at most 64"},
		orchestrator: []string{`servers[0] (s).tools[0] (` + long + `): model-facing name "s__` + long + `"`, "at most 64"},
	}, {
		name: "declared read, marked destructive by an untrusted server",
		config: `servers:
  - name: untrusted
    transport: http
    url: ` + srv.url + `
    tools: [{name: echo, effect: read}, {name: wipe, effect: read}]`,
		worker: []string{"servers[0] (untrusted).tools[1] (wipe).effect: declared read, but the server marks the tool destructiveHint: true"},
		// The check needs the server's annotations: only a worker connects.
		orchestratorTool: "untrusted__wipe",
	}, {
		name: "tool not on its server",
		config: `servers:
  - name: untrusted
    transport: http
    url: ` + srv.url + `
    tools: [{name: echo, effect: read}, {name: shred, effect: write}]`,
		worker:           []string{"servers[0] (untrusted): configured tools not on the server: shred (the server has: echo, wipe)"},
		orchestratorTool: "untrusted__shred",
	}}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := filepath.Join(dir, fmt.Sprintf("mcp-%d.yaml", i))
			if err := os.WriteFile(cfg, []byte(tc.config+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			stderr := workerExit(t, url, fmt.Sprintf("bad-%d", i), cfg)
			t.Logf("the worker said: %s", lastLine(stderr))
			for _, want := range tc.worker {
				if !strings.Contains(stderr, want) {
					t.Errorf("worker's stderr does not say %q:\n%s", want, stderr)
				}
			}
			if tc.orchestrator == nil {
				orchestratorKnows(t, url, cfg, tc.orchestratorTool)
				return
			}
			stderr = orchestratorExit(t, url, cfg)
			t.Logf("the orchestrator said: %s", lastLine(stderr))
			for _, want := range tc.orchestrator {
				if !strings.Contains(stderr, want) {
					t.Errorf("orchestrator's stderr does not say %q:\n%s", want, stderr)
				}
			}
		})
	}
}

// lastLine is the last line of s that is not empty.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// TestMCPTokenNeverLogged puts a canary bearer token in an HTTP server's
// token_file and checks that no 8-byte piece of it is in anything a
// worker wrote or sent back, while it: starts and calls a tool with the
// token (the server checks it: the positive control), then meets the
// server refusing it (a call refused, a reconnect refused); nor in the
// error of a worker that cannot start against that server.
func TestMCPTokenNeverLogged(t *testing.T) {
	t.Parallel()
	checkTokenNeverWritten(t, refusePlainly, "Unauthorized")
}

// TestMCPTokenQuotedByServerNeverLogged is TestMCPTokenNeverLogged against
// a server whose refusal quotes the token back, in the JSON-RPC error of
// its 401 answer (docs/mcp.md: no secret is ever in an error, a log line
// or a span; the provider keys are redacted from what providers echo).
func TestMCPTokenQuotedByServerNeverLogged(t *testing.T) {
	t.Parallel()
	checkTokenNeverWritten(t, refuseQuoting, "is revoked")
}

// checkTokenNeverWritten is the canary test of the bearer token, with the
// server refusing it as refuse says once the worker has used it; refused
// is what the worker's stderr and the events hold of the refusals.
func checkTokenNeverWritten(t *testing.T, refuse int32, refused string) {
	const canary = "tok-canary-mcp-Qw7Zr4Xy2Mn8Pk5Ld3Hb9Vf"
	srv := startMCPHTTP(t, canary)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(canary+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "mcp.yaml")
	if err := os.WriteFile(cfg, []byte(`servers:
  - name: vault
    transport: http
    url: `+srv.url+`
    token_file: token   # relative to this file
    tools: [{name: echo, effect: read}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	url := storetest.NewDB(t)
	w := startWorkerProc(t, url, "w1", "--mcp-config", cfg, "--log-level", "debug",
		"--sim-tool-calls", "1", "--sim-finish-after", "2", "--sim-latency", "10ms")
	if srv.authorized.Load() == 0 {
		t.Fatal("the worker serves, but the server never saw the token: the grep would prove nothing")
	}
	o := startOrchestratorMain(t, url, []*workerProc{w}, "--mcp-config", cfg)
	var events strings.Builder // what the runs sent back
	run := func(key string) {
		s := e2eSpec(key, 1, 1_000_000)
		s.Tasks[0].AllowedTools = []string{"vault__echo"}
		evs := runAll(t, o.client, s)
		if st := evs[len(evs)-1].GetRunFinished().GetState(); st != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
			t.Errorf("run %s ended %s", key, st)
		}
		for _, ev := range evs {
			b, err := protojson.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			events.Write(b)
			events.WriteByte('\n')
		}
	}
	run("canary-accepted")
	if srv.toolCalls.Load() == 0 {
		t.Error("the worker made no tool call with the token")
	}
	srv.refuse.Store(refuse)
	run("canary-refused")
	stderrB := workerExit(t, url, "w2", cfg)
	w.stop(t) // a graceful stop: everything it would write is written

	for _, wr := range []struct{ where, text, mustHold string }{
		{"the worker's stderr", w.logs.all(), "mcp session open"},
		{"the worker's stderr", w.logs.all(), refused}, // the refusals were logged
		{"the worker's stdout", w.stdout.String(), ""},
		{"the runs' events", events.String(), refused}, // the refused call is in the task's summary
		{"the stderr of the worker that could not start", stderrB, "servers[0] (vault)"},
	} {
		t.Logf("searched %s: %d bytes", wr.where, len(wr.text))
		if !strings.Contains(wr.text, wr.mustHold) {
			t.Errorf("%s does not hold %q: grepping it for the token would prove nothing", wr.where, wr.mustHold)
		}
		if p, ok := llmtest.LeakedPiece(wr.text, canary); ok {
			t.Errorf("%s holds a piece of the bearer token (%q):\n%s", wr.where, p, llmtest.LinesHolding(wr.text, p))
		}
	}
}
