// Command scale runs fanout at the scale of issue 44 on one machine: real
// PostgreSQL, the real binary's orchestrators and workers as separate
// processes, the sim model. `make scale` runs every scenario at full size;
// bench/README.md ("bench/scale") says what each measures and how to read
// the tables it prints.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fanout/fanout/bench/internal/fleet"
	"github.com/fanout/fanout/peer"
	"github.com/fanout/fanout/store"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-scale: %v\n", err)
		os.Exit(1)
	}
}

// scenarios are the scenarios' names, in the order they run.
var scenarios = []string{"wide", "memory", "cancel", "noisy"}

type config struct {
	fanoutBin, tmpDir, pgBinDir, mcpDir string
	scenarios                           []string
	workers                             int
	total, runLimit, sample             time.Duration
	// tasks, if set, scales every scenario down to about that many
	// subagents (-tasks): see scaled.
	tasks int

	// wide: one run of wideTasks, then wideRuns runs of wideRunTasks at
	// once; each task wideCalls sim calls of wideLatency, a tool call
	// between two (tool: "memory", the MCP server-memory over stdio, or
	// "search", the built-in).
	wideTasks, wideRuns, wideRunTasks, wideCalls int
	wideLatency                                  time.Duration
	tool                                         string
	// memory: one run of each of memoryTasks, one call of memoryLatency.
	memoryTasks   []int
	memoryLatency time.Duration
	// cancel: cancelRuns runs of cancelRunTasks tasks over orchestrators
	// orchestrators, calls of cancelLatency (long: the runs are cancelled
	// in flight).
	cancelRuns, cancelRunTasks, orchestrators int
	cancelLatency                             time.Duration
	// noisy: one tenant with noisyHot subagents in flight (noisyHotCalls
	// calls each, a tool call between two) while noisyTenants tenants each
	// run noisySmallRuns fan-outs of noisySmallTasks one-call tasks, one
	// after another; calls of noisyLatency.
	noisyHot, noisyHotCalls, noisyTenants, noisySmallRuns, noisySmallTasks int
	noisyLatency                                                           time.Duration

	// smoke checks that every scenario works at a tiny size, measuring
	// nothing worth reading.
	smoke bool
}

func parseConfig(args []string) (config, error) {
	var c config
	var names, memoryTasks string
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	fs.StringVar(&c.fanoutBin, "fanout", ".tmp/bin/fanout", "the fanout binary measured (go build ./cmd/fanout)")
	fs.StringVar(&c.tmpDir, "tmp-dir", "", "parent of the run's temporary directory (PostgreSQL cluster, credentials); default the system's")
	fs.StringVar(&c.pgBinDir, "pg-bin-dir", "", "directory of initdb/pg_ctl/postgres (default: found on PATH or /usr/lib/postgresql/*/bin)")
	fs.StringVar(&c.mcpDir, "mcp-dir", ".ci/mcp", "directory of the pinned MCP servers' node_modules (scripts/ensure-mcp-servers.sh), for -tool memory")
	fs.StringVar(&names, "scenario", strings.Join(scenarios, ","), "scenarios to run, comma-separated: "+strings.Join(scenarios, ", "))
	fs.IntVar(&c.workers, "workers", 3, "worker processes")
	fs.IntVar(&c.tasks, "tasks", 0, "scale every scenario down to about this many subagents (0: full size; each scenario's own flags say how it scales)")
	fs.DurationVar(&c.total, "timeout", 90*time.Minute, "deadline of the whole harness")
	fs.DurationVar(&c.runLimit, "run-timeout", 15*time.Minute, "deadline of each scenario's load (its runs' run_timeout too)")
	fs.DurationVar(&c.sample, "sample", time.Second, "how often RSS, /metrics and pg_stat_activity are sampled")
	fs.IntVar(&c.wideTasks, "wide-tasks", 10_000, "wide (a): tasks of the one run (0: skip)")
	fs.IntVar(&c.wideRuns, "wide-runs", 100, "wide (b): runs at once (0: skip)")
	fs.IntVar(&c.wideRunTasks, "wide-run-tasks", 100, "wide (b): tasks of each run")
	fs.IntVar(&c.wideCalls, "wide-calls", 3, "wide: sim calls of each task, a tool call between two")
	fs.DurationVar(&c.wideLatency, "wide-latency", 2*time.Second, "wide: latency of each sim call")
	fs.StringVar(&c.tool, "tool", "memory", "wide: the tool the tasks call: memory (MCP server-memory's search_nodes over stdio, one session per worker) or search (built-in)")
	fs.StringVar(&memoryTasks, "memory-tasks", "1000,10000", "memory: tasks of each run, comma-separated (one run each, one sim call per task)")
	fs.DurationVar(&c.memoryLatency, "memory-latency", 4*time.Second, "memory: latency of the one sim call")
	fs.IntVar(&c.cancelRuns, "cancel-runs", 1000, "cancel: runs in flight, then cancelled at once")
	fs.IntVar(&c.cancelRunTasks, "cancel-run-tasks", 3, "cancel: tasks of each run")
	fs.IntVar(&c.orchestrators, "orchestrators", 2, "cancel: orchestrator processes (the runs and the WatchRun streams spread over them)")
	fs.DurationVar(&c.cancelLatency, "cancel-latency", 10*time.Minute, "cancel: latency of each sim call (longer than the scenario: every run is cancelled in flight)")
	fs.IntVar(&c.noisyHot, "noisy-hot", 2000, "noisy: the busy tenant's subagents in flight")
	fs.IntVar(&c.noisyHotCalls, "noisy-hot-calls", 50, "noisy: sim calls of each of the busy tenant's tasks, at most 50 (a task's max_iterations): long enough to outlast the small tenants' fan-outs")
	fs.IntVar(&c.noisyTenants, "noisy-tenants", 50, "noisy: small tenants, running at once")
	fs.IntVar(&c.noisySmallRuns, "noisy-small-runs", 3, "noisy: fan-outs of each small tenant, one after another")
	fs.IntVar(&c.noisySmallTasks, "noisy-small-tasks", 10, "noisy: tasks of each small fan-out, one call each")
	fs.DurationVar(&c.noisyLatency, "noisy-latency", 500*time.Millisecond, "noisy: latency of each sim call")
	fs.BoolVar(&c.smoke, "smoke", false, "check that every scenario works at a tiny size (a few tasks, short calls); the tables it prints mean nothing")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if c.scenarios, err = fleet.Names(names, "scenario", scenarios); err != nil {
		return c, fmt.Errorf("-scenario: %w", err)
	}
	if c.memoryTasks, err = fleet.Ints(memoryTasks); err != nil {
		return c, fmt.Errorf("-memory-tasks: %w", err)
	}
	if c.tool != "memory" && c.tool != "search" {
		return c, fmt.Errorf("-tool: memory or search, got %q", c.tool)
	}
	if c.smoke {
		c.tasks = smokeTasks
		c.wideLatency, c.memoryLatency, c.noisyLatency = 300*time.Millisecond, 500*time.Millisecond, 200*time.Millisecond
		c.cancelRuns, c.noisyTenants, c.noisySmallRuns, c.noisySmallTasks, c.noisyHotCalls = 4, 2, 1, 2, 30
		c.sample = 250 * time.Millisecond
		c.runLimit = 2 * time.Minute
	}
	if c.tasks > 0 {
		c.scaleTo(c.tasks)
	}
	if c.workers < 1 || c.orchestrators < 1 {
		return c, fmt.Errorf("-workers %d, -orchestrators %d: need at least 1 of each", c.workers, c.orchestrators)
	}
	if c.wideCalls > maxIterations || c.noisyHotCalls > maxIterations {
		return c, fmt.Errorf("-wide-calls %d, -noisy-hot-calls %d: a task makes at most %d calls (max_iterations)", c.wideCalls, c.noisyHotCalls, maxIterations)
	}
	if c.wideCalls < 2 || c.noisyHotCalls < 2 {
		return c, fmt.Errorf("-wide-calls %d, -noisy-hot-calls %d: a task with a tool makes at least 2 calls", c.wideCalls, c.noisyHotCalls)
	}
	if c.wideLatency <= 0 || c.memoryLatency <= 0 || c.cancelLatency <= 0 || c.noisyLatency <= 0 {
		return c, errors.New("every latency must be > 0")
	}
	return c, nil
}

// maxIterations is the API's most iterations of a task.
const maxIterations = 50

// smokeTasks is -smoke's -tasks.
const smokeTasks = 12

// scaleTo scales every scenario down to about n subagents: wide's one run n
// tasks, its runs at once n/100 of 100 (at least 2 runs of n/2); memory one
// run of n/10 and one of n; cancel n/10 runs (at least 4); noisy's busy
// tenant n/5.
func (c *config) scaleTo(n int) {
	c.wideTasks = n
	c.wideRuns, c.wideRunTasks = n/100, 100
	if c.wideRuns < 2 {
		c.wideRuns, c.wideRunTasks = 2, max(1, n/2)
	}
	c.memoryTasks = []int{max(1, n/10), n}
	if !c.smoke {
		c.cancelRuns = max(4, n/10)
	}
	c.noisyHot = max(2, n/5)
}

// harness is what every scenario shares: the PostgreSQL, the peer
// credentials, the MCP config, a pool as the database's owner.
type harness struct {
	cfg   config
	db    *fleet.Database
	owner *store.Pool
	peer  peer.DevFiles
	tmp   string
	// mcpConfig is the workers' and orchestrators' --mcp-config (-tool
	// memory), or "".
	mcpConfig string
	began     time.Time
	// runSeq makes every run's idempotency key its own.
	runSeq, tenantSeq atomic.Int64
}

func run(ctx context.Context, args []string) error {
	cfg, err := parseConfig(args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, cfg.total, fmt.Errorf("the whole harness ran past -timeout %v", cfg.total))
	defer cancel()
	if _, err := os.Stat(cfg.fanoutBin); err != nil {
		return fmt.Errorf("fanout binary: %w (build it: go build -o %s ./cmd/fanout)", err, cfg.fanoutBin)
	}
	h := &harness{cfg: cfg, began: time.Now()}
	if h.tmp, err = fleet.TempDir(cfg.tmpDir, "fanout-bench-scale-"); err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(h.tmp) }()
	if h.db, err = fleet.StartPostgres(ctx, h.tmp, cfg.pgBinDir, cfg.fanoutBin); err != nil {
		return err
	}
	defer h.db.Stop()
	if h.owner, err = store.Open(ctx, h.db.OwnerURL); err != nil {
		return err
	}
	defer h.owner.Close()
	if h.peer, err = peer.GenerateDev(filepath.Join(h.tmp, "peer")); err != nil {
		return fmt.Errorf("generate peer credentials: %w", err)
	}
	if slices.Contains(cfg.scenarios, "wide") && cfg.tool == "memory" {
		if h.mcpConfig, err = writeMCPConfig(h.tmp, cfg.mcpDir); err != nil {
			return err
		}
	}
	fmt.Printf("# bench/scale: %s\n\n", describe(cfg))
	fmt.Printf("%s; %d CPUs; load average %s at the start\n", h.db.Settings, runtime.NumCPU(), fleet.LoadAverage())
	var failed []string
	for _, name := range cfg.scenarios {
		var reps []*report
		var err error
		switch name {
		case "wide":
			reps, err = h.wide(ctx)
		case "memory":
			reps, err = h.memory(ctx)
		case "cancel":
			reps, err = h.cancel(ctx)
		case "noisy":
			reps, err = h.noisy(ctx)
		}
		for _, r := range reps {
			r.print(os.Stdout)
		}
		if err != nil {
			// The next scenarios run all the same: a fleet that fails at
			// one scale may hold at another.
			fmt.Printf("\n**%s FAILED**: %s\n", name, clip(err.Error()))
			fmt.Fprintf(os.Stderr, "bench-scale: %s FAILED: %s\n", name, clip(err.Error()))
			failed = append(failed, name)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		fmt.Fprintf(os.Stderr, "bench-scale: %s done (%v so far)\n", name, time.Since(h.began).Round(time.Second))
	}
	fmt.Printf("\nload average %s at the end; %v in all\n", fleet.LoadAverage(), time.Since(h.began).Round(time.Second))
	if len(failed) > 0 {
		return fmt.Errorf("%s failed (above)", strings.Join(failed, ", "))
	}
	return nil
}

// describe is the harness's configuration in one line, for the report.
func describe(c config) string {
	bin, _ := filepath.Abs(c.fanoutBin)
	s := fmt.Sprintf("binary %s; scenarios %s; %d workers", bin, strings.Join(c.scenarios, ","), c.workers)
	if c.smoke {
		s += "; SMOKE (tiny sizes, nothing measured)"
	} else if c.tasks > 0 {
		s += fmt.Sprintf("; scaled down to -tasks %d", c.tasks)
	}
	return s
}

// writeMCPConfig writes the workers' MCP config: the pinned server-memory
// over stdio (one session, one node process per worker), its search_nodes
// declared a read.
func writeMCPConfig(tmp, mcpDir string) (string, error) {
	server, err := filepath.Abs(filepath.Join(mcpDir, "node_modules", "@modelcontextprotocol", "server-memory", "dist", "index.js"))
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(server); err != nil {
		return "", fmt.Errorf("-tool memory: %w (run scripts/ensure-mcp-servers.sh, or -tool search)", err)
	}
	path := filepath.Join(tmp, "mcp.yaml")
	yaml := fmt.Sprintf(`servers:
  - name: memory
    transport: stdio
    command: node
    args: [%q]
    env:
      - {name: MEMORY_FILE_PATH, value: %q}
    connect_timeout: 30s
    call_timeout: 60s
    tools:
      - {name: search_nodes, effect: read}
`, server, filepath.Join(tmp, "memory.jsonl"))
	return path, os.WriteFile(path, []byte(yaml), 0o644)
}

// clip shortens an error for the report: a refused spec of 2,000 tasks
// says so once per task.
func clip(s string) string {
	const most = 1500
	if len(s) <= most {
		return s
	}
	return fmt.Sprintf("%s… (%d bytes in all)", s[:most], len(s))
}
