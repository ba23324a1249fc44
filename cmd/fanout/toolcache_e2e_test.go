package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent/mcp"
)

// cacheLookupsMetric sums fanout_tool_cache_lookups_total by result in a
// /metrics page.
func cacheLookupsMetric(page string) map[string]int64 {
	n := map[string]int64{}
	for _, line := range strings.Split(page, "\n") {
		if !strings.HasPrefix(line, "fanout_tool_cache_lookups_total{") {
			continue
		}
		i := strings.Index(line, `result="`)
		j := strings.LastIndexByte(line, ' ')
		if i < 0 || j < 0 {
			continue
		}
		result := line[i+len(`result="`):]
		result = result[:strings.IndexByte(result, '"')]
		v, err := strconv.ParseFloat(line[j+1:], 64)
		if err == nil {
			n[result] += int64(v)
		}
	}
	return n
}

// cachedCalls adds up TaskIteration.cached_tool_calls and tool_calls in evs.
func cachedCalls(evs []*fanoutv1.RunEvent) (cached, calls int32) {
	for _, ev := range evs {
		if it := ev.GetTaskIteration(); it != nil {
			cached += it.GetCachedToolCalls()
			calls += it.GetToolCalls()
		}
	}
	return cached, calls
}

// TestReadToolCacheAcrossRuns (issue 46, docs/mcp.md#the-result-cache-for-read-tools):
// real processes and a real MCP server (server-memory's search_nodes, a
// read with cache_ttl, behind the recording shim). A run of tenant e2e with
// cache.tools calls the server for each of its reads; the same run again
// (same tasks, so the sim makes the same calls) calls it for none, and its
// TaskIteration events, streamed and stored (WatchRun after the end), say
// every call was cached; the same run of another tenant, and one of tenant
// e2e without cache.tools, call it for every read again. The worker's
// fanout_tool_cache_lookups_total counts the hits and misses.
func TestReadToolCacheAcrossRuns(t *testing.T) {
	t.Parallel()
	cfg, shimDir, _ := memoryServerConfig(t, []any{map[string]any{"name": "search_nodes", "effect": "read", "cache_ttl": "10m"}})

	url := storetest.NewDB(t)
	const tasks, callsPerTurn = 3, 2
	w := startWorkerProc(t, url, "w1", "--mcp-config", cfg, "--sim-tool-calls", fmt.Sprint(callsPerTurn),
		"--sim-finish-after", "2", "--poll-interval", e2ePoll, "--sweep-interval", e2eSweep,
		"--metrics-listen", "127.0.0.1:0")
	o := startOrchestratorMain(t, url, []*workerProc{w}, "--mcp-config", cfg,
		"--poll-interval", e2ePoll, "--sweep-interval", e2eSweep)

	read := mcp.ModelName("memory", "search_nodes")
	reads := func() int {
		n := 0
		for _, r := range readShimRecords(t, shimDir) {
			if r.Kind == "request" && r.Tool == "search_nodes" {
				n++
			}
		}
		return n
	}
	// run runs the demo-sized run of tenant with or without the cache, and
	// returns its events and how many reads the server got meanwhile.
	run := func(key, tenant string, cache bool) ([]*fanoutv1.RunEvent, int) {
		t.Helper()
		s := e2eSpec(key, tasks, 5_000_000)
		s.TenantId = tenant
		if cache {
			s.Cache = &fanoutv1.CacheSettings{Tools: true}
		}
		for _, task := range s.GetTasks() {
			task.AllowedTools = []string{read}
		}
		before := reads()
		client := o.client
		if tenant != "e2e" {
			client = tenantClient(t, o.addr, tenant)
		}
		evs := runAll(t, client, s)
		fin := evs[len(evs)-1].GetRunFinished()
		if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
			t.Fatalf("run %s ended %s (%s), want SUCCEEDED", key, fin.GetState(), fin.GetCancelCause())
		}
		return evs, reads() - before
	}
	const want = tasks * callsPerTurn // the reads of one run

	evs, n := run("cache-first", "e2e", true)
	if cached, calls := cachedCalls(evs); n != want || calls != want || cached != 0 {
		t.Fatalf("the first run: %d reads at the server, %d tool calls and %d cached in its events; want %d, %d, 0",
			n, calls, cached, want, want)
	}
	evs, n = run("cache-again", "e2e", true)
	if cached, calls := cachedCalls(evs); n != 0 || calls != want || cached != want {
		t.Errorf("the same run again: %d reads at the server, %d tool calls and %d cached in its events; want 0, %d, %d",
			n, calls, cached, want, want)
	}
	stored := watchAll(t, o.client, evs[0].GetRunId(), nil)
	if cached, _ := cachedCalls(stored); cached != want {
		t.Errorf("the second run's stored events (WatchRun) have %d cached calls, want %d", cached, want)
	}
	evs, n = run("cache-other-tenant", "other", true)
	if cached, _ := cachedCalls(evs); n != want || cached != 0 {
		t.Errorf("the same run of tenant other: %d reads at the server, %d cached; want %d, 0 (tenants never share entries)",
			n, cached, want)
	}
	evs, n = run("cache-off", "e2e", false)
	if cached, _ := cachedCalls(evs); n != want || cached != 0 {
		t.Errorf("the same run of tenant e2e without cache.tools: %d reads at the server, %d cached; want %d, 0", n, cached, want)
	}
	lookups := cacheLookupsMetric(scrapeMetrics(t, w.logs.all()))
	if lookups["hit"] != want || lookups["miss"] != 2*want || lookups["error"] != 0 {
		t.Errorf("the worker's fanout_tool_cache_lookups_total: %v; want hit %d, miss %d (the first run and tenant other's), no error",
			lookups, want, 2*want)
	}
}
