package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

func TestEffectRules(t *testing.T) {
	t.Parallel()
	yes, no := true, false
	readOnly := &sdk.ToolAnnotations{ReadOnlyHint: true}
	for _, tc := range []struct {
		name     string
		declared string
		trusted  bool
		ann      *sdk.ToolAnnotations
		want     subagent.Effect
		err      bool
	}{
		{"declared read wins over no annotations", EffectRead, false, nil, subagent.EffectRead, false},
		{"declared write wins over a trusted read-only hint", EffectWrite, true, readOnly, subagent.EffectWrite, false},
		{"undeclared, trusted read-only hint", "", true, readOnly, subagent.EffectRead, false},
		{"undeclared, untrusted read-only hint", "", false, readOnly, subagent.EffectWrite, false},
		{"undeclared, trusted, no annotations", "", true, nil, subagent.EffectWrite, false},
		{"undeclared, trusted, false hint", "", true, &sdk.ToolAnnotations{}, subagent.EffectWrite, false},
		{"declared read, marked destructive", EffectRead, false, &sdk.ToolAnnotations{DestructiveHint: &yes}, subagent.EffectWrite, true},
		{"declared read, marked destructive, trusted", EffectRead, true, &sdk.ToolAnnotations{DestructiveHint: &yes}, subagent.EffectWrite, true},
		{"declared read, destructive false", EffectRead, false, &sdk.ToolAnnotations{DestructiveHint: &no}, subagent.EffectRead, false},
	} {
		got, err := effectOf(tc.declared, tc.trusted, tc.ann)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("%s: effectOf = %v, %v; want %v, error %t", tc.name, got, err, tc.want, tc.err)
		}
	}
}

// TestToolListPagination: the server returns its tools two to a page; a
// configured tool on the last page is found, with its description and
// input schema.
func TestToolListPagination(t *testing.T) {
	t.Parallel()
	ts := newTestServer(2)
	for i := range 9 {
		ts.srv.AddTool(&sdk.Tool{Name: fmt.Sprintf("t%02d", i), Description: fmt.Sprintf("tool %d", i),
			InputSchema: json.RawMessage(fmt.Sprintf(`{"type":"object","properties":{"p%d":{"type":"number"}}}`, i))},
			func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) { return textResult("ok"), nil })
	}
	m := openInMemory(t, ts, mustParse(t, serverYAML("", "{name: t08}", "{name: t00}")), nil)
	if n := ts.lists.Load(); n < 5 {
		t.Errorf("tools/list requests = %d; want at least 5 pages of 2 for 17 tools", n)
	}
	last := tool(t, m, "t__t08")
	if last.Description != "tool 8" || last.Server != "t" || last.Effect != subagent.EffectWrite {
		t.Errorf("t__t08 = %+v", last)
	}
	var s map[string]any
	if err := json.Unmarshal(last.Schema, &s); err != nil || s["properties"].(map[string]any)["p8"] == nil {
		t.Errorf("t__t08 schema = %s (%v); want the server's, with p8", last.Schema, err)
	}
	if names := []string{m.Tools()[0].Name, m.Tools()[1].Name}; names[0] != "t__t08" || names[1] != "t__t00" {
		t.Errorf("Tools() order = %v; want the config's", names)
	}
}

// TestMissingToolIsAStartError names exactly the configured tools the
// server lacks, and what it has.
func TestMissingToolIsAStartError(t *testing.T) {
	t.Parallel()
	ts := newTestServer(3)
	log, _ := testLogger()
	_, err := Open(t.Context(), Options{Config: mustParse(t, serverYAML("", "{name: echo}", "{name: create_issue}", "{name: fial}")),
		Logger: log, transport: ts.inMemory(nil)})
	if err == nil {
		t.Fatal("Open succeeded with tools the server lacks")
	}
	for _, want := range []string{"servers[0] (t): configured tools not on the server: create_issue, fial",
		"(the server has: big, block, delete_all, echo, fail, links, structured)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// TestReadDeclaredOnADestructiveToolIsAStartError: the operator's read
// contradicts the server's destructiveHint; the worker does not start.
func TestReadDeclaredOnADestructiveToolIsAStartError(t *testing.T) {
	t.Parallel()
	ts := newTestServer(0)
	log, _ := testLogger()
	_, err := Open(t.Context(), Options{Config: mustParse(t, serverYAML("", "{name: echo}", "{name: delete_all, effect: read}")),
		Logger: log, transport: ts.inMemory(nil)})
	if err == nil || !strings.Contains(err.Error(), "servers[0] (t).tools[1] (delete_all).effect: declared read, but the server marks the tool destructiveHint: true") {
		t.Fatalf("Open = %v; want the contradiction, naming the entry", err)
	}
}

func TestOpenSaysWhatTheConfigNeeds(t *testing.T) {
	t.Parallel()
	cfg := mustParse(t, serverYAML("    rpm: 10\n    max_in_flight: 2\n", "{name: echo, max_in_flight: 1}"))
	_, err := Open(t.Context(), Options{Config: cfg})
	for _, want := range []string{"servers[0] (t).rpm: needs Options.RateLimiter", "servers[0] (t).max_in_flight: needs Options.Semaphore",
		"servers[0] (t).tools[0] (echo).max_in_flight: needs Options.Semaphore"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Open = %v; want %q", err, want)
		}
	}
}

// TestEffectsFromAnnotations: trusted annotations make an undeclared
// read-only tool a read; untrusted ones do not.
func TestEffectsFromAnnotations(t *testing.T) {
	t.Parallel()
	for _, trusted := range []bool{true, false} {
		ts := newTestServer(0)
		m := openInMemory(t, ts, mustParse(t, serverYAML(fmt.Sprintf("    trust_annotations: %t\n", trusted), "{name: echo}", "{name: fail, effect: read}")), nil)
		want := subagent.EffectWrite
		if trusted {
			want = subagent.EffectRead
		}
		if got := tool(t, m, "t__echo").Effect; got != want {
			t.Errorf("trusted %t: echo (readOnlyHint) effect %v, want %v", trusted, got, want)
		}
		if got := tool(t, m, "t__fail").Effect; got != subagent.EffectRead {
			t.Errorf("trusted %t: fail (declared read) effect %v", trusted, got)
		}
	}
}

// TestOneSessionForManyCalls: 20 calls one after another, then 40 at once,
// share the server's one session (one initialize), never one per call.
func TestOneSessionForManyCalls(t *testing.T) {
	t.Parallel()
	ts := newTestServer(0)
	m := openInMemory(t, ts, mustParse(t, serverYAML("", "{name: echo}")), nil)
	echo := tool(t, m, "t__echo")
	for i := range 20 {
		if _, err := echo.Func(t.Context(), subagent.ToolCall{Name: echo.Name, Args: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, 40)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = echo.Func(t.Context(), subagent.ToolCall{Name: echo.Name, Args: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if n, calls := ts.initializes.Load(), ts.calls.Load(); n != 1 || calls != 60 {
		t.Errorf("initialize requests %d, tools/call %d; want 1 and 60", n, calls)
	}
}

// TestToolListChangedIsReRead: a tool whose definition changes on the
// server is offered with the new one after notifications/tools/list_changed.
func TestToolListChangedIsReRead(t *testing.T) {
	t.Parallel()
	ts := newTestServer(0)
	m := openInMemory(t, ts, mustParse(t, serverYAML("    trust_annotations: true\n", "{name: fail}")), nil)
	if tl := tool(t, m, "t__fail"); tl.Effect != subagent.EffectWrite {
		t.Fatalf("fail before the change: %+v", tl)
	}
	ts.srv.AddTool(&sdk.Tool{Name: "fail", Description: "Fails, read-only now.", Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true},
		InputSchema: json.RawMessage(`{"type":"object","properties":{"why":{"type":"string"}}}`)},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) { return textResult("ok"), nil })
	eventually(t, "the changed definition of fail offered", func() bool {
		tl := tool(t, m, "t__fail")
		return tl.Description == "Fails, read-only now." && tl.Effect == subagent.EffectRead && strings.Contains(string(tl.Schema), "why")
	})
	if n := ts.initializes.Load(); n != 1 {
		t.Errorf("initialize requests = %d; the list is re-read on the same session", n)
	}
}

// TestRateBucketWaitEndsNotSent: a server's rpm goes through the rate
// limiter (llm.MemoryLimiter here, store.RateLimiter in a fleet); a call
// that cannot get through before its deadline was never sent.
func TestRateBucketWaitEndsNotSent(t *testing.T) {
	t.Parallel()
	ts := newTestServer(0)
	lim := llm.NewMemoryLimiter()
	log, _ := testLogger()
	m, err := Open(t.Context(), Options{Config: mustParse(t, serverYAML("    rpm: 1\n", "{name: echo}")),
		RateLimiter: lim, Logger: log, transport: ts.inMemory(nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// A bucket is defined empty: the first call waits for it to fill.
	ctx, cancel := context.WithTimeoutCause(t.Context(), patience/100, errors.New("test deadline"))
	defer cancel()
	_, err = tool(t, m, "t__echo").Func(ctx, subagent.ToolCall{Name: "t__echo", Args: json.RawMessage(`{}`)})
	if !errors.Is(err, subagent.ErrNotSent) || !strings.Contains(err.Error(), "rate bucket mcp:t") || !strings.Contains(err.Error(), "test deadline") {
		t.Fatalf("call = %v; want a not-sent error naming the bucket and the deadline's cause", err)
	}
	if n := ts.calls.Load(); n != 0 {
		t.Errorf("the server got %d calls", n)
	}
}

// TestCloseEndsCalls: after Close a call fails as not sent, and nothing
// the manager started is left running (goleak in TestMain).
func TestCloseEndsCalls(t *testing.T) {
	t.Parallel()
	ts := newTestServer(0)
	m := openInMemory(t, ts, mustParse(t, serverYAML("", "{name: echo}")), nil)
	echo := tool(t, m, "t__echo")
	m.Close()
	m.Close()
	_, err := echo.Func(t.Context(), subagent.ToolCall{Name: echo.Name})
	if !errors.Is(err, subagent.ErrNotSent) || !errors.Is(err, ErrClosed) {
		t.Errorf("call after Close = %v; want ErrClosed (not sent)", err)
	}
}

// TestSessionThatCannotBeOpenedIsNotSent: the server went away and no
// session can be opened: a write fails as not sent, naming why.
func TestSessionThatCannotBeOpenedIsNotSent(t *testing.T) {
	t.Parallel()
	ts := newTestServer(0)
	var failing atomic.Bool
	m := openInMemory(t, ts, mustParse(t, serverYAML("", "{name: echo, effect: write}")), &failing)
	failing.Store(true)
	ts.endSessions()
	eventually(t, "the manager sees the session end", func() bool { return sessionEnded(m, "t") })
	_, err := tool(t, m, "t__echo").Func(t.Context(), subagent.ToolCall{Name: "t__echo", IdempotencyKey: "k"})
	if !errors.Is(err, subagent.ErrNotSent) || !strings.Contains(err.Error(), "test server unreachable") {
		t.Fatalf("call = %v; want not sent, saying why", err)
	}
	failing.Store(false)
	if _, err := call(t, m, "t__echo", `{}`); err != nil {
		t.Fatalf("call once the server is back: %v", err)
	}
}

// TestCloseCutsOffCallsInFlight: Close does not wait for a call that would
// run for long: the call ends (it may have happened: not ErrNotSent) and
// the server is told.
func TestCloseCutsOffCallsInFlight(t *testing.T) {
	t.Parallel()
	ts := newTestServer(0)
	m := openInMemory(t, ts, mustParse(t, serverYAML("", "{name: block}")), nil)
	done := make(chan error, 1)
	go func() {
		_, err := call(t, m, "t__block", `{}`)
		done <- err
	}()
	await(t, ts.started, "the server's handler started")
	closed := make(chan struct{})
	go func() {
		m.Close()
		close(closed)
	}()
	err := await(t, done, "the call in flight ended at Close")
	if errors.Is(err, subagent.ErrNotSent) || !strings.Contains(err.Error(), "closed during the call") {
		t.Errorf("call cut off by Close = %v; want 'closed during the call', not ErrNotSent", err)
	}
	if cause := await(t, ts.cancelled, "the server's handler saw its context end"); cause == nil {
		t.Error("the server's handler ended without a cause")
	}
	await(t, closed, "Close returned")
}

// TestToolMarkedDestructiveLosesItsCacheTTL
// (docs/mcp.md#the-result-cache-for-read-tools): a tool declared read with
// a cache_ttl is offered with it; once its server marks it destructive
// (tools/list_changed after start) it is a write, offered with no
// CacheTTL: a write is never answered from the result cache.
func TestToolMarkedDestructiveLosesItsCacheTTL(t *testing.T) {
	t.Parallel()
	ts := newTestServer(0)
	m := openInMemory(t, ts, mustParse(t, serverYAML("", "{name: fail, effect: read, cache_ttl: 1m}")), nil)
	if tl := tool(t, m, "t__fail"); tl.Effect != subagent.EffectRead || tl.CacheTTL != time.Minute {
		t.Fatalf("fail before the change: effect %v, cache TTL %s; want a read cached for 1m", tl.Effect, tl.CacheTTL)
	}
	yes := true
	ts.srv.AddTool(&sdk.Tool{Name: "fail", Description: "Fails, destructive now.", Annotations: &sdk.ToolAnnotations{DestructiveHint: &yes},
		InputSchema: objectSchema},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) { return textResult("ok"), nil })
	eventually(t, "fail offered as a write", func() bool { return tool(t, m, "t__fail").Effect == subagent.EffectWrite })
	if tl := tool(t, m, "t__fail"); tl.CacheTTL != 0 {
		t.Errorf("fail, now a write, is offered with cache TTL %s; want none", tl.CacheTTL)
	}
}
