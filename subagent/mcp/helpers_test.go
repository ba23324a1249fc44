package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"

	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm/llmtest"
)

// serveEnv, set to "1", makes the test binary an MCP server on its stdin
// and stdout (a real process for the stdio tests) instead of running tests.
const serveEnv = "FANOUT_MCP_TEST_SERVE"

// canary is the secret of the tests that check a credential never shows
// (a bearer token, a secret env value). No 8-byte piece of it is in any
// message the code writes.
const canary = "tok-canary-Vb8Rq2LmZx7WkPy3NcJd5HsTf"

// defaultLog is everything written through slog.Default() while the
// package's tests run: TestMain checks the canary never reached it.
var defaultLog syncBuffer

func TestMain(m *testing.M) {
	if os.Getenv(serveEnv) == "1" {
		serveStdio()
		return
	}
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&defaultLog, &slog.HandlerOptions{Level: slog.LevelDebug})))
	code := m.Run()
	slog.SetDefault(prev)
	if p, ok := llmtest.LeakedPiece(defaultLog.String(), canary); ok {
		fmt.Fprintf(os.Stderr, "the canary secret (%q) leaked into slog.Default():\n%s\n", p, llmtest.LinesHolding(defaultLog.String(), p))
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// serveStdio is the child process of the stdio tests: the test server's
// tools over stdin/stdout, plus pid (its process id), env (its
// environment) and die (appends to $FANOUT_MCP_TEST_DIE_LOG, then exits
// mid-call). It writes its secret env value to stderr once, and a password
// in a line of its own, which the worker must redact.
func serveStdio() {
	ts := newTestServer(0)
	ts.srv.AddTool(&sdk.Tool{Name: "pid", InputSchema: objectSchema}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return textResult(fmt.Sprint(os.Getpid())), nil
	})
	ts.srv.AddTool(&sdk.Tool{Name: "env", InputSchema: objectSchema}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		env := os.Environ()
		slices.Sort(env)
		return textResult(strings.Join(env, "\n")), nil
	})
	ts.srv.AddTool(&sdk.Tool{Name: "die", InputSchema: objectSchema}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		f, err := os.OpenFile(os.Getenv("FANOUT_MCP_TEST_DIE_LOG"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err == nil {
			fmt.Fprintln(f, "die called")
			_ = f.Close()
		}
		os.Exit(3)
		return nil, nil
	})
	if v := os.Getenv("SECRET_FOR_STDERR"); v != "" {
		fmt.Fprintf(os.Stderr, "starting with secret %s in the environment\n", v)
		fmt.Fprintln(os.Stderr, "connecting with password=stderr-pw-Q7") // a secret nobody named: the rule's
	}
	if err := ts.srv.Run(context.Background(), &sdk.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// patience bounds every wait that must end by itself: one that has not
// by then fails saying what did not happen. The tests' claims are
// orderings, not speeds.
const patience = 20 * time.Second

func await[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(patience):
		t.Fatalf("%s: did not happen within %s", what, patience)
		panic("unreachable")
	}
}

// eventually polls cond until it holds, failing after patience.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, patience)
		}
		time.Sleep(5 * time.Millisecond) // A poll interval, not a synchronization.
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testLogger returns a logger into a buffer the test can read.
func testLogger() (*slog.Logger, *syncBuffer) {
	var b syncBuffer
	return slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug})), &b
}

var objectSchema = json.RawMessage(`{"type":"object"}`)

func textResult(s string) *sdk.CallToolResult {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: s}}}
}

// testServer is an in-process MCP server (the SDK's) with the tools the
// tests call, counting what it is asked.
type testServer struct {
	srv         *sdk.Server
	initializes atomic.Int64
	lists       atomic.Int64
	calls       atomic.Int64

	started   chan struct{} // block began
	cancelled chan error    // block's context ended, with this cause

	mu       sync.Mutex
	sessions []*sdk.ServerSession // in-memory sessions, to end them
}

func newTestServer(pageSize int) *testServer {
	ts := &testServer{started: make(chan struct{}, 16), cancelled: make(chan error, 16)}
	ts.srv = sdk.NewServer(&sdk.Implementation{Name: "testserver", Version: "1"}, &sdk.ServerOptions{PageSize: pageSize})
	ts.srv.AddReceivingMiddleware(func(next sdk.MethodHandler) sdk.MethodHandler {
		return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
			switch method {
			case "initialize":
				ts.initializes.Add(1)
			case "tools/list":
				ts.lists.Add(1)
			case "tools/call":
				ts.calls.Add(1)
			}
			return next(ctx, method, req)
		}
	})
	readOnly := &sdk.ToolAnnotations{ReadOnlyHint: true}
	yes := true
	ts.srv.AddTool(&sdk.Tool{Name: "echo", Description: "Echoes its arguments and _meta.", Annotations: readOnly,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}}}`)},
		func(_ context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			b, _ := json.Marshal(map[string]any{"args": req.Params.Arguments, "meta": req.Params.Meta})
			return textResult(string(b)), nil
		})
	ts.srv.AddTool(&sdk.Tool{Name: "fail", InputSchema: objectSchema}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: "the widget is broken"}}}, nil
	})
	ts.srv.AddTool(&sdk.Tool{Name: "big", InputSchema: objectSchema}, func(_ context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		var args struct{ N int }
		_ = json.Unmarshal(req.Params.Arguments, &args)
		return textResult(strings.Repeat("é", args.N/2)), nil // 2 bytes a character
	})
	ts.srv.AddTool(&sdk.Tool{Name: "links", InputSchema: objectSchema}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return &sdk.CallToolResult{Content: []sdk.Content{
			&sdk.TextContent{Text: "two documents"},
			&sdk.ResourceLink{URI: "https://docs.example/a", Name: "a"},
			&sdk.EmbeddedResource{Resource: &sdk.ResourceContents{URI: "file:///notes/b.txt", MIMEType: "text/plain", Text: "b's text"}},
		}}, nil
	})
	ts.srv.AddTool(&sdk.Tool{Name: "structured", InputSchema: objectSchema}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return &sdk.CallToolResult{Content: []sdk.Content{}, StructuredContent: map[string]any{"total": 3, "items": []string{"x"}}}, nil
	})
	ts.srv.AddTool(&sdk.Tool{Name: "block", InputSchema: objectSchema}, func(ctx context.Context, _ *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		ts.started <- struct{}{}
		select {
		case <-ctx.Done():
			ts.cancelled <- context.Cause(ctx)
			return nil, ctx.Err()
		case <-time.After(patience):
			return textResult("never cancelled"), nil
		}
	})
	ts.srv.AddTool(&sdk.Tool{Name: "delete_all", Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes}, InputSchema: objectSchema},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			return textResult("deleted"), nil
		})
	return ts
}

// inMemory returns an Options.transport that connects each session to ts
// over the SDK's in-memory transport; while failing is set, connects fail.
func (ts *testServer) inMemory(failing *atomic.Bool) func(context.Context, ServerConfig) (sdk.Transport, error) {
	return func(ctx context.Context, _ ServerConfig) (sdk.Transport, error) {
		if failing != nil && failing.Load() {
			return nil, errors.New("test server unreachable")
		}
		st, ct := sdk.NewInMemoryTransports()
		ss, err := ts.srv.Connect(ctx, st, nil)
		if err != nil {
			return nil, err
		}
		ts.mu.Lock()
		ts.sessions = append(ts.sessions, ss)
		ts.mu.Unlock()
		return ct, nil
	}
}

// endSessions ends every in-memory session from the server's side: what a
// client sees when its server restarts.
func (ts *testServer) endSessions() {
	ts.mu.Lock()
	sessions := ts.sessions
	ts.sessions = nil
	ts.mu.Unlock()
	for _, ss := range sessions {
		_ = ss.Close()
	}
}

// serverYAML is a config of one server "t" whose transport the tests
// replace, with the given tool entries.
func serverYAML(extra string, tools ...string) string {
	var b strings.Builder
	b.WriteString("servers:\n  - name: t\n    transport: stdio\n    command: unused\n")
	b.WriteString(extra)
	b.WriteString("    tools:\n")
	for _, t := range tools {
		fmt.Fprintf(&b, "      - %s\n", t)
	}
	return b.String()
}

func mustParse(t *testing.T, yaml string) *Config {
	t.Helper()
	cfg, err := Parse([]byte(yaml))
	if err != nil {
		t.Fatalf("Parse:\n%s\nerror: %v", yaml, err)
	}
	return cfg
}

// openInMemory opens a manager on ts with cfg; the test closes it.
func openInMemory(t *testing.T, ts *testServer, cfg *Config, failing *atomic.Bool) *Manager {
	t.Helper()
	log, _ := testLogger()
	m, err := Open(t.Context(), Options{Config: cfg, Logger: log, transport: ts.inMemory(failing)})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(m.Close)
	return m
}

// tool returns the manager's tool called name.
func tool(t *testing.T, m *Manager, name string) subagent.Tool {
	t.Helper()
	for _, tl := range m.Tools() {
		if tl.Name == name {
			return tl
		}
	}
	t.Fatalf("no tool %s among %v", name, m.Tools())
	panic("unreachable")
}

// call calls tool name of m with args.
func call(t *testing.T, m *Manager, name, args string) (subagent.ToolResult, error) {
	t.Helper()
	return tool(t, m, name).Func(t.Context(), subagent.ToolCall{Name: name, Args: json.RawMessage(args)})
}

// sessionID returns the ID of server name's live session.
func sessionID(m *Manager, name string) string {
	for _, s := range m.servers {
		if s.cfg.Name == name {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.sess != nil {
				return s.sess.cs.ID()
			}
		}
	}
	return ""
}

// sessionEnded reports whether server name has no live session.
func sessionEnded(m *Manager, name string) bool {
	for _, s := range m.servers {
		if s.cfg.Name == name {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.sess == nil || s.sess.isEnded()
		}
	}
	return true
}

// httpServer is the test server behind the SDK's streamable HTTP handler
// on a loopback address that survives a restart.
type httpServer struct {
	t       *testing.T
	ts      *testServer
	addr    string
	token   atomic.Pointer[string] // the bearer token required; nil: none
	srv     *httptest.Server
	handler atomic.Pointer[sdk.StreamableHTTPHandler]
	reject  atomic.Pointer[rejection]
}

// rejection makes the server answer every request of one session with an
// HTTP error status and a JSON-RPC error body, as the TypeScript SDK's
// servers answer a session ID they do not know (400), or as a proxy in
// front of a server might (502).
type rejection struct {
	session string
	status  int
}

func startHTTP(t *testing.T, ts *testServer) *httpServer {
	h := &httpServer{t: t, ts: ts}
	h.srv = httptest.NewServer(h.mux())
	h.addr = h.srv.Listener.Addr().String()
	t.Cleanup(func() {
		h.stop()
		// The sessions of handlers a restart replaced are still open on
		// the server, as a dead process's would not be.
		for ss := range ts.srv.Sessions() {
			_ = ss.Close()
		}
	})
	return h
}

func (h *httpServer) url() string { return "http://" + h.addr + "/mcp" }

// mux checks the token, then serves MCP through the current handler (a
// restart replaces it, and its sessions with it).
func (h *httpServer) mux() http.Handler {
	h.handler.Store(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return h.ts.srv }, nil))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if want := h.token.Load(); want != nil && r.Header.Get("Authorization") != "Bearer "+*want {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		if rej := h.reject.Load(); rej != nil && r.Header.Get("Mcp-Session-Id") == rej.session {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(rej.status)
			_, _ = io.WriteString(w, `{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"},"id":null}`)
			return
		}
		h.handler.Load().ServeHTTP(w, r)
	})
}

func (h *httpServer) stop() {
	if h.srv != nil {
		h.srv.CloseClientConnections()
		h.srv.Close()
		h.srv = nil
	}
}

// restart stops the server and starts a new one, with no sessions, on the
// same address.
func (h *httpServer) restart() {
	h.t.Helper()
	h.stop()
	var l net.Listener
	eventually(h.t, "listen again on "+h.addr, func() bool {
		var err error
		l, err = net.Listen("tcp", h.addr)
		return err == nil
	})
	h.srv = &httptest.Server{Listener: l, Config: &http.Server{Handler: h.mux()}}
	h.srv.Start()
}

// httpYAML is a config of one HTTP server "t" at url with the given extra
// server lines and tools.
func httpYAML(url, extra string, tools ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "servers:\n  - name: t\n    transport: http\n    url: %s\n%s    tools:\n", url, extra)
	for _, t := range tools {
		fmt.Fprintf(&b, "      - %s\n", t)
	}
	return b.String()
}

// writeFile writes a file in t's temporary directory and returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := t.TempDir() + "/" + name
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
