package subagent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/mcp"
)

// slotWindow is how long a test waits, once the server has the bound's
// calls in flight, for one more. A client that asks for too few slots (or
// the wrong keys) gets the extra call's slots at its first try, as free
// slots: the call reaches the server after one acquire statement and one
// HTTP request on loopback, milliseconds even on a busy 2-core machine, so
// 2 s is a margin of about 100x. A correct client never lets it in however
// long the window.
const slotWindow = 2 * time.Second

// heldServer is an MCP server over streamable HTTP whose tools hold every
// call until the test releases it, counting at the server the calls in
// flight of each tool and of the whole server ("") and the most there ever
// were at once.
type heldServer struct {
	url     string
	entered chan struct{} // a nudge, buffered: a call began

	mu        sync.Mutex
	now, most map[string]int
	release   chan struct{}
}

func newHeldServer(t *testing.T, tools ...string) *heldServer {
	t.Helper()
	h := &heldServer{entered: make(chan struct{}, 1), now: map[string]int{}, most: map[string]int{}, release: make(chan struct{})}
	srv := sdk.NewServer(&sdk.Implementation{Name: "held", Version: "1"}, nil)
	for _, name := range tools {
		srv.AddTool(&sdk.Tool{Name: name, InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(ctx context.Context, _ *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
				release := h.enter(name)
				defer h.leave(name)
				select {
				case <-release:
					return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "held " + name}}}, nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			})
	}
	hs := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, nil))
	h.url = hs.URL
	t.Cleanup(func() {
		h.releaseAll()
		for ss := range srv.Sessions() {
			_ = ss.Close()
		}
		hs.Close()
	})
	return h
}

// enter counts a call of tool in and returns the channel that releases it.
func (h *heldServer) enter(tool string) <-chan struct{} {
	h.mu.Lock()
	for _, k := range []string{tool, ""} {
		h.now[k]++
		h.most[k] = max(h.most[k], h.now[k])
	}
	release := h.release
	h.mu.Unlock()
	select {
	case h.entered <- struct{}{}:
	default:
	}
	return release
}

func (h *heldServer) leave(tool string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.now[tool]--
	h.now[""]--
}

func (h *heldServer) releaseAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.release:
	default:
		close(h.release)
	}
}

// peak returns the most calls of key in flight at once so far.
func (h *heldServer) peak(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.most[key]
}

// reset starts a new measurement: nothing is in flight, the counts start
// again and calls hold until the next release.
func (h *heldServer) reset(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.now[""] != 0 {
		t.Fatalf("reset with %d calls in flight", h.now[""])
	}
	h.now, h.most, h.release = map[string]int{}, map[string]int{}, make(chan struct{})
}

// measure makes the calls at once, one goroutine each, and holds them at
// the server until it has want calls of key in flight (the whole server
// for ""), then slotWindow longer unless more come first; then it releases
// them all and waits for every call, which must succeed. It returns the
// most calls of key that were ever in flight at once, released ones
// included.
func (h *heldServer) measure(t *testing.T, key string, want int, calls []subagent.Tool) int {
	t.Helper()
	ctx := within(t)
	errs := make(chan error, len(calls))
	for _, tool := range calls {
		go func() {
			res, err := tool.Func(ctx, subagent.ToolCall{Name: tool.Name, Args: json.RawMessage(`{}`)})
			switch {
			case err != nil:
				errs <- fmt.Errorf("%s: %w", tool.Name, err)
			case res.IsError || res.Text == "":
				errs <- fmt.Errorf("%s: result %+v", tool.Name, res)
			default:
				errs <- nil
			}
		}()
	}
	h.hold(t, key, want)
	h.releaseAll()
	for range calls {
		if err := await(t, errs, "an MCP call to end once released"); err != nil {
			t.Errorf("call %v", err)
		}
	}
	return h.peak(key)
}

// hold returns once the server has had more than want calls of key in
// flight at once, or slotWindow after it first had want; it fails t if it
// never had want within patience.
func (h *heldServer) hold(t *testing.T, key string, want int) {
	t.Helper()
	deadline := time.NewTimer(patience)
	defer deadline.Stop()
	for h.peak(key) < want {
		select {
		case <-h.entered:
		case <-deadline.C:
			t.Errorf("the server never had %d calls of %q in flight at once within %v (at most %d)", want, key, patience, h.peak(key))
			return
		}
	}
	window := time.NewTimer(slotWindow)
	defer window.Stop()
	for h.peak(key) <= want {
		select {
		case <-h.entered:
		case <-window.C:
			return
		}
	}
}

// testSemaphore is *store.Semaphore as an mcp.Semaphore, as node's adapter
// makes it (node/mcp.go; package subagent may not import store).
type testSemaphore struct{ s *store.Semaphore }

func (a testSemaphore) Acquire(ctx context.Context, holder string, want []mcp.SlotRequest, ttl time.Duration) (mcp.Lease, error) {
	req := make([]store.SlotRequest, len(want))
	for i, w := range want {
		req[i] = store.SlotRequest{Key: w.Key, Limit: w.Limit}
	}
	l, err := a.s.Acquire(ctx, holder, req, ttl)
	if err != nil {
		return nil, err
	}
	return &testLease{s: a.s, l: l}, nil
}

type testLease struct {
	s *store.Semaphore
	l store.SlotLease
}

func (l *testLease) Hold(ctx context.Context, fn func(context.Context) error) error {
	return l.s.Hold(ctx, &l.l, fn)
}

func (l *testLease) Release(ctx context.Context, grace time.Duration) error {
	return l.s.Release(ctx, l.l, grace)
}

// mcpWorkers opens one MCP client per holder on the config (YAML), each
// with its own pool on the database at url and the fleet's semaphore in
// it, as a worker process opens its MCP servers (node's openWorkerTools).
// It returns each worker's tools by name.
func mcpWorkers(t *testing.T, url, config string, holders ...string) []map[string]subagent.Tool {
	t.Helper()
	cfg, err := mcp.Parse([]byte(config))
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]subagent.Tool
	for _, holder := range holders {
		pool, err := store.Open(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		m, err := mcp.Open(t.Context(), mcp.Options{Config: cfg, Holder: holder,
			Semaphore: testSemaphore{store.NewSemaphore(pool, store.SemaphoreConfig{})}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close) // before the pool closes: cleanups run last first
		tools := map[string]subagent.Tool{}
		for _, tl := range m.Tools() {
			tools[tl.Name] = tl
		}
		out = append(out, tools)
	}
	return out
}

// spread is n calls of each tool named, taken in turn from each worker.
func spread(workers []map[string]subagent.Tool, n int, names ...string) []subagent.Tool {
	var calls []subagent.Tool
	for i := range n {
		for _, name := range names {
			calls = append(calls, workers[i%len(workers)][name])
		}
	}
	return calls
}

// TestMCPServerBoundIsFleetWide measures an MCP server's own max_in_flight
// (key mcp:<server>) through the MCP client, on the fleet's semaphore in
// PostgreSQL: a server with max_in_flight 3 and two tools with no limit of
// their own, called 12 times at once (6 calls of each tool, from two
// workers, each with its own holder and pool). Counted at the server, the
// most calls in flight at once must be exactly 3: a client that does not
// ask for the server's slot, or asks for it per tool or per worker, lets
// 6 or 12 in; one that asks for fewer never reaches 3.
func TestMCPServerBoundIsFleetWide(t *testing.T) {
	t.Parallel()
	const bound = 3
	srv := newHeldServer(t, "a", "b")
	workers := mcpWorkers(t, storetest.NewDB(t), fmt.Sprintf(`servers:
  - name: held
    transport: http
    url: %s
    max_in_flight: %d
    tools:
      - {name: a, effect: read}
      - {name: b, effect: read}
`, srv.url, bound), "w1", "w2")

	calls := spread(workers, 6, "held__a", "held__b")
	if most := srv.measure(t, "", bound, calls); most != bound {
		t.Errorf("the server had at most %d of %d calls in flight at once, want exactly its max_in_flight, %d, across both workers and tools",
			most, len(calls), bound)
	}
}

// TestMCPServerAndToolBoundsBothHold: one server with max_in_flight 3 and
// a tool "slow" with max_in_flight 2 of its own (and a tool "other" with
// none), called from two workers. Each bound binds in turn, counted at the
// server: 8 calls of slow alone have exactly 2 in flight at once (the
// tool's bound, under the server's 3); then 8 of slow and 8 of other
// together have exactly 3 in flight on the server (its bound), slow never
// more than 2. A client that takes only one of the two slots when both are
// set fails one of the two.
func TestMCPServerAndToolBoundsBothHold(t *testing.T) {
	t.Parallel()
	const serverBound, toolBound = 3, 2
	srv := newHeldServer(t, "slow", "other")
	workers := mcpWorkers(t, storetest.NewDB(t), fmt.Sprintf(`servers:
  - name: held
    transport: http
    url: %s
    max_in_flight: %d
    tools:
      - {name: slow, effect: read, max_in_flight: %d}
      - {name: other, effect: read}
`, srv.url, serverBound, toolBound), "w1", "w2")

	if most := srv.measure(t, "slow", toolBound, spread(workers, 8, "held__slow")); most != toolBound {
		t.Errorf("slow alone: at most %d calls of it in flight at once, want exactly its own max_in_flight, %d (the server's is %d)",
			most, toolBound, serverBound)
	}
	srv.reset(t)
	if most := srv.measure(t, "", serverBound, spread(workers, 8, "held__slow", "held__other")); most != serverBound {
		t.Errorf("slow and other together: at most %d calls in flight on the server at once, want exactly its max_in_flight, %d",
			most, serverBound)
	}
	if most := srv.peak("slow"); most > toolBound {
		t.Errorf("slow and other together: %d calls of slow in flight at once, more than its max_in_flight, %d", most, toolBound)
	}
	if got := []int{srv.peak("slow"), srv.peak("other")}; slices.Contains(got, 0) {
		t.Errorf("slow and other together: most in flight of each = %v; want both called", got)
	}
}
