package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fanout/fanout/subagent"
)

// echoed is what the test server's echo tool returns.
type echoed struct {
	Args json.RawMessage `json:"args"`
	Meta map[string]any  `json:"meta"`
}

func decodeEcho(t *testing.T, res subagent.ToolResult) echoed {
	t.Helper()
	var e echoed
	if err := json.Unmarshal([]byte(res.Text), &e); err != nil {
		t.Fatalf("echo result %q: %v", res.Text, err)
	}
	return e
}

// TestArgumentsArriveIntact: the model's JSON reaches the server as it
// was sent: big and fractional numbers, arrays, nested objects, nulls,
// and no field the model left out.
func TestArgumentsArriveIntact(t *testing.T) {
	t.Parallel()
	ts := newTestServer(0)
	m := openInMemory(t, ts, mustParse(t, serverYAML("", "{name: echo, effect: read}")), nil)
	for _, args := range []string{
		`{"n":9007199254740993,"f":1.50,"neg":-2e-7,"s":"é \"q\" \u2028","b":false,"z":null,"tags":["a",1,{"k":[]}],"o":{"p":{"q":{}}}}`,
		`{"only":"required"}`,
		`{}`,
	} {
		res, err := call(t, m, "t__echo", args)
		if err != nil {
			t.Fatal(err)
		}
		got := decodeEcho(t, res).Args
		if !jsonEqualExact(t, got, json.RawMessage(args)) {
			t.Errorf("server got %s; sent %s", got, args)
		}
	}
	res, err := call(t, m, "t__echo", "")
	if err != nil || string(decodeEcho(t, res).Args) != "{}" {
		t.Errorf("no arguments: server got %s (%v); want {}", res.Text, err)
	}
	for _, bad := range []string{`[1]`, `"s"`, `{"a":`} {
		if _, err := call(t, m, "t__echo", bad); !errors.Is(err, subagent.ErrNotSent) {
			t.Errorf("arguments %s: %v; want refused as not sent", bad, err)
		}
	}
}

// jsonEqualExact compares two JSON texts token by token, numbers as
// written (1.50 is not 1.5).
func jsonEqualExact(t *testing.T, a, b json.RawMessage) bool {
	t.Helper()
	dec := func(r json.RawMessage) any {
		d := json.NewDecoder(strings.NewReader(string(r)))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatalf("%s: %v", r, err)
		}
		return v
	}
	return reflect.DeepEqual(dec(a), dec(b))
}

// TestIdempotencyKeyInMeta: a write's key reaches the server in _meta.
func TestIdempotencyKeyInMeta(t *testing.T) {
	t.Parallel()
	ts := newTestServer(0)
	m := openInMemory(t, ts, mustParse(t, serverYAML("", "{name: echo, effect: write}")), nil)
	echo := tool(t, m, "t__echo")
	if echo.Effect != subagent.EffectWrite {
		t.Fatalf("echo effect %v", echo.Effect)
	}
	res, err := echo.Func(t.Context(), subagent.ToolCall{Name: echo.Name, Args: json.RawMessage(`{"n":1}`), IdempotencyKey: "run1/task2/3/0"})
	if err != nil {
		t.Fatal(err)
	}
	if got := decodeEcho(t, res).Meta[MetaIdempotencyKey]; got != "run1/task2/3/0" {
		t.Errorf("server's _meta %v; want %s = run1/task2/3/0", decodeEcho(t, res).Meta, MetaIdempotencyKey)
	}
}

func TestResults(t *testing.T) {
	t.Parallel()
	ts := newTestServer(0)
	m := openInMemory(t, ts, mustParse(t, serverYAML("    max_result_bytes: 1000\n", "{name: fail}", "{name: big}", "{name: links}", "{name: structured}")), nil)

	t.Run("isError", func(t *testing.T) {
		res, err := call(t, m, "t__fail", `{}`)
		if err != nil || !res.IsError || res.Text != "the widget is broken" {
			t.Errorf("fail = %+v, %v; want IsError with the server's message", res, err)
		}
	})
	t.Run("truncated with a marker", func(t *testing.T) {
		res, err := call(t, m, "t__big", `{"n":5001}`) // 2,500 two-byte characters
		if err != nil {
			t.Fatal(err)
		}
		body, marker, ok := strings.Cut(res.Text, "\n[truncated: ")
		if !ok || len(body) != 1000 || strings.Trim(body, "é") != "" {
			t.Fatalf("result %d bytes, body %d; want the first 1000 bytes whole, then the marker", len(res.Text), len(body))
		}
		if want := "4000 of 5000 bytes cut; results are limited to 1000 bytes]"; marker != want {
			t.Errorf("marker %q; want %q", marker, want)
		}
		if res, _ := call(t, m, "t__big", `{"n":1000}`); strings.Contains(res.Text, "truncated") || len(res.Text) != 1000 {
			t.Errorf("a result of exactly the limit was cut: %d bytes", len(res.Text))
		}
	})
	t.Run("cut on a character boundary", func(t *testing.T) {
		if got := truncate("aé", 2); !strings.HasPrefix(got, "a\n[truncated: 2 of 3 bytes cut") {
			t.Errorf("truncate(aé, 2) = %q", got)
		}
	})
	t.Run("resources to sources", func(t *testing.T) {
		res, err := call(t, m, "t__links", `{}`)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"https://docs.example/a", "file:///notes/b.txt"}; !slices.Equal(res.Sources, want) {
			t.Errorf("sources %v; want %v", res.Sources, want)
		}
		for _, want := range []string{"two documents", "[resource link: https://docs.example/a (a)]", "b's text"} {
			if !strings.Contains(res.Text, want) {
				t.Errorf("text %q lacks %q", res.Text, want)
			}
		}
	})
	t.Run("structured content as JSON", func(t *testing.T) {
		res, err := call(t, m, "t__structured", `{}`)
		if err != nil || res.Text != `{"items":["x"],"total":3}` {
			t.Errorf("structured = %q, %v", res.Text, err)
		}
	})
}

// TestCancellationReachesTheServer: cancelling a call returns at once and
// the server's handler sees its context end (the SDK sends
// notifications/cancelled).
func TestCancellationReachesTheServer(t *testing.T) {
	t.Parallel()
	for _, transport := range []string{"memory", "http"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			ts := newTestServer(0)
			var m *Manager
			if transport == "http" {
				h := startHTTP(t, ts)
				m = openHTTP(t, mustParse(t, httpYAML(h.url(), "", "{name: block}")))
			} else {
				m = openInMemory(t, ts, mustParse(t, serverYAML("", "{name: block}")), nil)
			}
			ctx, cancel := context.WithCancelCause(t.Context())
			done := make(chan error, 1)
			go func() {
				_, err := tool(t, m, "t__block").Func(ctx, subagent.ToolCall{Name: "block"})
				done <- err
			}()
			await(t, ts.started, "the server's handler started")
			cancel(errors.New("run cancelled"))
			err := await(t, done, "the call returned after its context was cancelled")
			if errors.Is(err, subagent.ErrNotSent) || !strings.Contains(err.Error(), "run cancelled") {
				t.Errorf("call = %v; want the cancel's cause, and not 'not sent' (it was)", err)
			}
			if cause := await(t, ts.cancelled, "the server's handler saw its context end"); !errors.Is(cause, context.Canceled) {
				t.Errorf("server handler's cause %v", cause)
			}
		})
	}
}

// openHTTP opens a manager on cfg with its own transports.
func openHTTP(t *testing.T, cfg *Config) *Manager {
	t.Helper()
	m, _ := openHTTPLogged(t, cfg)
	return m
}

func openHTTPLogged(t *testing.T, cfg *Config) (*Manager, *syncBuffer) {
	t.Helper()
	log, buf := testLogger()
	m, err := Open(t.Context(), Options{Config: cfg, Logger: log})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(m.Close)
	return m, buf
}

// TestHTTPServerRestartRecovered: the server restarts on the same address
// with none of its sessions; the worker notices, and the next call runs
// on a new session.
func TestHTTPServerRestartRecovered(t *testing.T) {
	t.Parallel()
	ts := newTestServer(0)
	h := startHTTP(t, ts)
	m := openHTTP(t, mustParse(t, httpYAML(h.url(), "", "{name: echo, effect: write}")))
	if _, err := call(t, m, "t__echo", `{"n":1}`); err != nil {
		t.Fatal(err)
	}
	h.restart()
	eventually(t, "the worker notices its session is gone", func() bool { return sessionEnded(m, "t") })
	if _, err := call(t, m, "t__echo", `{"n":2}`); err != nil {
		t.Fatalf("call after the restart: %v", err)
	}
	if n := ts.initializes.Load(); n != 2 {
		t.Errorf("initialize requests %d; want 2 (the first session and the new one)", n)
	}
}

// TestHTTPSessionGoneRecovered: the server no longer knows the session the
// worker holds and refuses it with a 4xx: the call, which the server never
// ran, is sent again on a fresh session.
func TestHTTPSessionGoneRecovered(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		refuse func(h *httpServer, session string)
	}{
		{"404 from a handler without the session (Go SDK)", func(h *httpServer, _ string) {
			h.handler.Store(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return h.ts.srv }, nil))
		}},
		{"400 Bad Request: No valid session ID (TypeScript SDK)", func(h *httpServer, session string) {
			h.reject.Store(&rejection{session: session, status: http.StatusBadRequest})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ts := newTestServer(0)
			h := startHTTP(t, ts)
			m, logs := openHTTPLogged(t, mustParse(t, httpYAML(h.url(), "", "{name: echo, effect: write}")))
			if _, err := call(t, m, "t__echo", `{"n":1}`); err != nil {
				t.Fatal(err)
			}
			tc.refuse(h, sessionID(m, "t"))
			res, err := call(t, m, "t__echo", `{"n":2}`)
			if err != nil || string(decodeEcho(t, res).Args) != `{"n":2}` {
				t.Fatalf("call after the session was lost: %v, %v", res, err)
			}
			if n := ts.calls.Load(); n != 2 {
				t.Errorf("tools/call handled %d times; want 2 (each call once)", n)
			}
			if !strings.Contains(logs.String(), "sending it on a fresh session") {
				t.Errorf("the log does not say the call was sent again:\n%s", logs.String())
			}
		})
	}
}

// TestHTTP5xxIsNotProofOfNotSent: a 502 may come from a proxy whose
// upstream got the call: the write fails, is not sent again, and its error
// does not claim it was never sent.
func TestHTTP5xxIsNotProofOfNotSent(t *testing.T) {
	t.Parallel()
	ts := newTestServer(0)
	h := startHTTP(t, ts)
	m, logs := openHTTPLogged(t, mustParse(t, httpYAML(h.url(), "", "{name: echo, effect: write}")))
	if _, err := call(t, m, "t__echo", `{"n":1}`); err != nil {
		t.Fatal(err)
	}
	h.reject.Store(&rejection{session: sessionID(m, "t"), status: http.StatusBadGateway})
	_, err := call(t, m, "t__echo", `{"n":2}`)
	if err == nil || errors.Is(err, subagent.ErrNotSent) {
		t.Fatalf("write answered 502 = %v; want an error that does not wrap ErrNotSent", err)
	}
	if strings.Contains(logs.String(), "sending it on a fresh session") {
		t.Errorf("the write was sent again:\n%s", logs.String())
	}
}
