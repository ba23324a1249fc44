package main

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/fanout/fanout/bench/internal/fleet"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// deployConfig is one scenario's fleet: the sim's calls are a worker's
// flags, so each scenario starts its own.
type deployConfig struct {
	orchestrators int
	capacity      int // subagents per worker
	maxTasks      int // the orchestrators' --max-tasks and --max-concurrency
	latency       time.Duration
	// finishAfter: the iteration at which a task that allows a tool
	// answers (one tool call an iteration before it); a task that allows
	// none answers at its first.
	finishAfter int
	mcp         bool // the workers and orchestrators get -tool memory's --mcp-config
}

// deployment is a running fleet and the harness's clients of it.
type deployment struct {
	fl *fleet.Fleet
	// conns are each orchestrator's client connections: a server holds
	// one connection to 256 streams (node.StreamsPerConn), so streams
	// spread over several.
	conns [][]*grpc.ClientConn
	next  atomic.Int64
	heaps *gcTraces
}

// connsPerOrchestrator is the client connections to each orchestrator:
// room for 2,000 streams at 250 each.
const connsPerOrchestrator = 8

// deploy starts dc's fleet: workers with the sim model at dc's calls (and
// GODEBUG=gctrace=1, whose lines tell each node's Go heap), then
// orchestrators dispatching to all of them, each with /metrics.
func (h *harness) deploy(ctx context.Context, dc deployConfig) (_ *deployment, err error) {
	d := &deployment{heaps: newGCTraces()}
	mcpArgs := func() []string {
		if dc.mcp && h.mcpConfig != "" {
			return []string{"--mcp-config", h.mcpConfig}
		}
		return nil
	}
	d.fl, err = fleet.Start(ctx, fleet.Config{Bin: h.cfg.fanoutBin, Peer: h.peer, NodeURL: h.db.NodeURL, Prefix: "scale",
		Workers: h.cfg.workers, Orchestrators: dc.orchestrators, Metrics: true, StartLimit: 60 * time.Second,
		Env:    []string{"GODEBUG=gctrace=1"},
		OnLine: func(node, line string, stderr bool) { d.heaps.line(node, line) },
		WorkerArgs: func(int) []string {
			return append([]string{"--capacity", strconv.Itoa(dc.capacity),
				"--sim-latency", dc.latency.String(), "--sim-finish-after", strconv.Itoa(max(1, dc.finishAfter)),
				"--sim-tool-calls", "1", "--sim-output-tokens", "64"}, mcpArgs()...)
		},
		OrchestratorArgs: func(int) []string {
			// --max-run-tokens 0: a run of 10,000 tasks of 3 calls, its
			// budget twice its tasks', is over the default cap of 100M.
			return append([]string{"--max-tasks", strconv.Itoa(dc.maxTasks), "--max-concurrency", strconv.Itoa(dc.maxTasks),
				"--max-run-tokens", "0"}, mcpArgs()...)
		},
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			d.stop()
		}
	}()
	for _, n := range append(append([]*fleet.Node(nil), d.fl.Orchestrators...), d.fl.Workers...) {
		fmt.Fprintf(os.Stderr, "bench-scale: %s (pid %d) serves %s, %s\n", n.Name, n.Pid(), n.Addr, n.Metrics)
	}
	for _, o := range d.fl.Orchestrators {
		var cs []*grpc.ClientConn
		for range connsPerOrchestrator {
			c, err := fleet.Dial(o.Addr, "")
			if err != nil {
				return nil, err
			}
			cs = append(cs, c)
		}
		d.conns = append(d.conns, cs)
	}
	return d, nil
}

// client is a client of orchestrator i (mod their number), on the next of
// its connections.
func (d *deployment) client(i int) fanoutv1.OrchestratorServiceClient {
	cs := d.conns[i%len(d.conns)]
	return fanoutv1.NewOrchestratorServiceClient(cs[int(d.next.Add(1))%len(cs)])
}

func (d *deployment) stop() {
	for _, cs := range d.conns {
		for _, c := range cs {
			_ = c.Close()
		}
	}
	d.fl.Stop()
}

// gcTraces keeps each node's Go heap as its GODEBUG=gctrace=1 lines tell
// it: at each collection, the live heap after it and the goroutine stacks.
// Any binary tells it, whatever its /metrics serves.
type gcTraces struct {
	mu    sync.Mutex
	nodes map[string]gcTrace
}

type gcTrace struct {
	live, stacks int64 // bytes, at the last collection
	gcs          int
}

func newGCTraces() *gcTraces { return &gcTraces{nodes: map[string]gcTrace{}} }

// gcLine is the part of a gctrace line this reads: "gc 12 @3.1s 2%: ...,
// 10->12->6 MB, 14 MB goal, 1 MB stacks, ...".
var gcLine = regexp.MustCompile(`^gc \d+ @.* (\d+)->(\d+)->(\d+) MB, \d+ MB goal, (\d+) MB stacks`)

func (g *gcTraces) line(node, line string) {
	m := gcLine.FindStringSubmatch(line)
	if m == nil {
		return
	}
	live, _ := strconv.ParseInt(m[3], 10, 64)
	stacks, _ := strconv.ParseInt(m[4], 10, 64)
	g.mu.Lock()
	defer g.mu.Unlock()
	t := g.nodes[node]
	g.nodes[node] = gcTrace{live: live << 20, stacks: stacks << 20, gcs: t.gcs + 1}
}

// get is node's heap at its last collection.
func (g *gcTraces) get(node string) (gcTrace, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t, ok := g.nodes[node]
	return t, ok
}

func (d *deployment) alive() error {
	if err := d.fl.Alive(); err != nil {
		return fmt.Errorf("a node died: %w", err)
	}
	return nil
}
