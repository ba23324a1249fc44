package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/fanout/fanout/bench/internal/fleet"
)

// langGraphSide is one Node.js process running bench/langgraph/bench.mjs,
// which invokes a LangGraph.js fan-out graph on request (one JSON line in,
// one out).
type langGraphSide struct {
	p       *fleet.Proc
	replies chan string
}

// Checkpointers of the LangGraph.js graph, as bench.mjs names them.
const (
	checkpointPostgres = "postgres"
	checkpointNone     = "none"
)

// startLangGraph starts node on dir/bench.mjs, checkpointing to pgURL, and
// waits until it has set up its checkpoint tables.
func startLangGraph(ctx context.Context, node, dir, pgURL string, latency time.Duration, limit time.Duration) (*langGraphSide, error) {
	l := &langGraphSide{replies: make(chan string, 16)}
	env := fleet.ChildEnv("BENCH_PG_URL="+pgURL, "SIM_LATENCY_MS="+strconv.FormatInt(latency.Milliseconds(), 10),
		"LANGSMITH_TRACING=false", "LANGCHAIN_TRACING_V2=false", "NODE_ENV=production")
	script, err := filepath.Abs(filepath.Join(dir, "bench.mjs"))
	if err != nil {
		return nil, err
	}
	l.p, err = fleet.StartProc("langgraph.js", env, func(line string, stderr bool) {
		if !stderr {
			l.replies <- line
		}
	}, node, script)
	if err != nil {
		return nil, err
	}
	var ready struct {
		Ready bool `json:"ready"`
	}
	line, err := fleet.WaitFor(ctx, l.p, "ready line", limit, l.replies)
	if err == nil {
		err = json.Unmarshal([]byte(line), &ready)
	}
	if err == nil && !ready.Ready {
		err = fmt.Errorf("langgraph.js: unexpected first line %s", line)
	}
	if err != nil {
		l.stop()
		return nil, err
	}
	return l, nil
}

// run invokes the graph of case c once (c.n parallel tasks, each c.calls
// sim calls of c.latency in a row) and returns the wall time bench.mjs
// measured around graph.invoke. A case of one call runs at the latency
// the process was started with.
func (l *langGraphSide) run(ctx context.Context, c benchCase, checkpointer string, limit time.Duration) (time.Duration, error) {
	n := c.n
	msg := map[string]any{"n": n, "checkpointer": checkpointer}
	if c.calls > 1 {
		msg["calls"], msg["latency_ms"] = c.calls, c.latency.Milliseconds()
	}
	req, err := json.Marshal(msg)
	if err != nil {
		return 0, err
	}
	if _, err := l.p.Stdin.Write(append(req, '\n')); err != nil {
		if exited := l.p.Exited(); exited != nil {
			return 0, exited
		}
		return 0, fmt.Errorf("langgraph.js: send request: %w", err)
	}
	line, err := fleet.WaitFor(ctx, l.p, fmt.Sprintf("answer to %s", req), limit, l.replies)
	if err != nil {
		return 0, err
	}
	var reply struct {
		WallMS  float64 `json:"wall_ms"`
		Results int     `json:"results"`
		Error   string  `json:"error"`
	}
	if err := json.Unmarshal([]byte(line), &reply); err != nil {
		return 0, fmt.Errorf("langgraph.js: reply %s: %w", line, err)
	}
	if reply.Error != "" {
		return 0, fmt.Errorf("langgraph.js: %d tasks, checkpointer %s: %s", n, checkpointer, reply.Error)
	}
	if reply.Results != n {
		return 0, fmt.Errorf("langgraph.js: %d results, want %d", reply.Results, n)
	}
	return time.Duration(reply.WallMS * float64(time.Millisecond)), nil
}

// stop closes the script's stdin, which ends it, and waits for it; then
// stops it the hard way if it is still there.
func (l *langGraphSide) stop() {
	_ = l.p.Stdin.Close()
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-l.p.Done():
	case <-t.C:
	}
	l.p.Stop(5 * time.Second)
}
