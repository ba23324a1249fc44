package subagent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// countingServer is an MCP server over streamable HTTP whose tools answer
// each call with its number among the calls of that tool ("lookup #2 of
// {...}"), so that a result from the cache is told from a fresh one.
type countingServer struct {
	url   string
	mu    sync.Mutex
	calls map[string]int
}

func newCountingServer(t *testing.T, tools ...string) *countingServer {
	t.Helper()
	c := &countingServer{calls: map[string]int{}}
	srv := sdk.NewServer(&sdk.Implementation{Name: "counting", Version: "1"}, nil)
	for _, name := range tools {
		srv.AddTool(&sdk.Tool{Name: name, InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(_ context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
				c.mu.Lock()
				c.calls[name]++
				n := c.calls[name]
				c.mu.Unlock()
				text := fmt.Sprintf("%s #%d of %s", name, n, req.Params.Arguments)
				return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: text}}}, nil
			})
	}
	hs := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, nil))
	c.url = hs.URL
	t.Cleanup(func() {
		for ss := range srv.Sessions() {
			_ = ss.Close()
		}
		hs.Close()
	})
	return c
}

func (c *countingServer) count(tool string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[tool]
}

// cacheLookups reads fanout.tool_cache.lookups by result.
func cacheLookups(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	n := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "fanout.tool_cache.lookups" {
				for _, p := range d.DataPoints {
					r, _ := p.Attributes.Value("result")
					n[r.AsString()] += p.Value
				}
			}
		}
	}
	return n
}

// cachedRun runs task id of b, which calls tool with args once, on a loop
// with the result cache, and returns what the model was shown of the call
// and the task's cached calls as its progress reported them.
func cachedRun(t *testing.T, b *bundle, cache subagent.ToolCache, tool subagent.Tool, id string, cacheTools bool,
	args string) (shown string, cached int) {
	t.Helper()
	m := &scripted{calls: []llm.ToolCall{{ID: "c0", Name: tool.Name, Args: json.RawMessage(args)}}}
	loop, _ := toolLoop(t, b, m, tool)
	loop.ToolCache = cache
	loop.Writes = store.NewToolCalls(b.pool, store.ToolCallsConfig{})
	var mu sync.Mutex
	loop.ProgressFunc = func(p subagent.Progress) {
		mu.Lock()
		defer mu.Unlock()
		cached += p.CachedToolCalls
	}
	task := newTask(b, id)
	task.AllowedTools = []string{tool.Name}
	task.CacheTools = cacheTools
	if sum := loop.Run(t.Context(), task); sum.Status != subagent.StatusSucceeded {
		t.Fatalf("task %s: status %s, err %v", id, sum.Status, sum.Err)
	}
	res := m.results(t)
	if len(res) != 1 {
		t.Fatalf("task %s: the model was shown %d tool results, want 1", id, len(res))
	}
	mu.Lock()
	defer mu.Unlock()
	return res[0].Content, cached
}

// TestReadToolResultsAreCached (docs/mcp.md#the-result-cache-for-read-tools):
// a read tool of a real MCP server with cache_ttl, called by tasks that opt
// in (Task.CacheTools), goes to the server once for the same arguments
// however their keys are ordered and spaced: the second task is shown the
// first one's result, counts a cached call in its progress, and
// fanout.tool_cache.lookups counts a hit. A task that did not opt in, and
// a call with other arguments, go to the server. It reads the global meter
// provider, so it does not call t.Parallel (as TestLoopOverrunIsLoud).
func TestReadToolResultsAreCached(t *testing.T) { //nolint:paralleltest // global meter provider
	reader := globalMeterReader()
	before := cacheLookups(t, reader)
	b := setup(t, 1_000_000, 50, map[string]int64{"a": 50_000, "b": 50_000, "c": 50_000, "d": 50_000})
	srv := newCountingServer(t, "lookup")
	tools := mcpWorkers(t, b.url, fmt.Sprintf(`servers:
  - name: crm
    transport: http
    url: %s
    tools:
      - {name: lookup, effect: read, cache_ttl: 1m}
`, srv.url), "w1")[0]
	lookup := tools["crm__lookup"]
	cache := store.NewToolCache(b.pool, nil)

	first, cached := cachedRun(t, b, cache, lookup, "a", true, `{"q":"x","n":1}`)
	if !strings.Contains(first, "lookup #1 of") || cached != 0 || srv.count("lookup") != 1 {
		t.Fatalf("task a was shown %q with %d cached calls, the server got %d calls; want its first answer, none cached, 1 call",
			first, cached, srv.count("lookup"))
	}
	again, cached := cachedRun(t, b, cache, lookup, "b", true, `{ "n": 1,  "q": "x" }`)
	if again != first || cached != 1 || srv.count("lookup") != 1 {
		t.Errorf("task b, the same arguments in another order, was shown %q with %d cached calls, the server got %d calls; "+
			"want task a's %q, 1 cached call, the server still at 1", again, cached, srv.count("lookup"), first)
	}
	if shown, cached := cachedRun(t, b, cache, lookup, "c", false, `{"q":"x","n":1}`); !strings.Contains(shown, "lookup #2 of") || cached != 0 {
		t.Errorf("task c, which did not opt in, was shown %q with %d cached calls; want the server's second answer, none cached", shown, cached)
	}
	if shown, cached := cachedRun(t, b, cache, lookup, "d", true, `{"q":"x","n":2}`); !strings.Contains(shown, "lookup #3 of") || cached != 0 {
		t.Errorf("task d, other arguments, was shown %q with %d cached calls; want the server's third answer, none cached", shown, cached)
	}
	after := cacheLookups(t, reader)
	if hit, miss := after["hit"]-before["hit"], after["miss"]-before["miss"]; hit != 1 || miss != 2 || after["error"] != before["error"] {
		t.Errorf("fanout.tool_cache.lookups gained hit %d, miss %d, error %d; want 1, 2 (tasks a and d), 0",
			hit, miss, after["error"]-before["error"])
	}
}

// TestWriteToolIsNeverCached (docs/mcp.md#the-result-cache-for-read-tools):
// a tool that is a write with a CacheTTL (as a read with cache_ttl becomes
// when its server marks it destructive after start) goes to the server at
// every call, in tasks that opt in, and nothing is stored for it.
func TestWriteToolIsNeverCached(t *testing.T) {
	t.Parallel()
	b := setup(t, 1_000_000, 50, map[string]int64{"a": 50_000, "b": 50_000})
	srv := newCountingServer(t, "lookup")
	tools := mcpWorkers(t, b.url, fmt.Sprintf(`servers:
  - name: crm
    transport: http
    url: %s
    tools:
      - {name: lookup, effect: read, cache_ttl: 1m}
`, srv.url), "w1")[0]
	write := tools["crm__lookup"]
	if write.CacheTTL == 0 {
		t.Fatal("the read tool has no CacheTTL: the test would prove nothing")
	}
	write.Effect = subagent.EffectWrite
	cache := store.NewToolCache(b.pool, nil)
	for i, id := range []string{"a", "b"} {
		shown, cached := cachedRun(t, b, cache, write, id, true, `{"q":"x"}`)
		if want := fmt.Sprintf("lookup #%d of", i+1); !strings.Contains(shown, want) || cached != 0 {
			t.Errorf("task %s was shown %q with %d cached calls; want %q from the server, none cached", id, shown, cached, want)
		}
	}
	var n int
	if err := b.pool.QueryRow(t.Context(), `SELECT count(*) FROM fanout.tool_result_cache`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d entries in the result cache after writes, want none", n)
	}
}
