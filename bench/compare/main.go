// Command compare measures fanout's fan-out overhead against LangGraph.js's
// in the same run, on the same machine and PostgreSQL: `make bench-compare`
// (bench/README.md says what is measured and how to read it).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fanout/fanout/bench/internal/fleet"
	"github.com/fanout/fanout/peer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-compare: %v\n", err)
		os.Exit(1)
	}
}

type config struct {
	fanoutBin, langGraphDir, node, tmpDir, pgBinDir string
	sizes, reps                                     []int
	// oneWave: the sizes of the one-wave case (a run's budget is exactly
	// the sum of its tasks' token_budgets), oneWaveReps their repetitions.
	oneWave, oneWaveReps []int
	// loopSizes: the sizes of the agent-loop case (each task makes
	// loopCalls sim calls of loopLatency in a row), loopReps their
	// repetitions.
	loopSizes, loopReps []int
	loopCalls           int
	// hotSizes: the sizes of the hot-tenant case (N tasks of hotCalls sim
	// calls of hotLatency, all in flight at once under one tenant with a
	// budget; hot.go), hotReps their repetitions.
	hotSizes, hotReps      []int
	hotCalls               int
	hotLatency             time.Duration
	warmup                 int
	latency, loopLatency   time.Duration
	runLimit, total, pause time.Duration
	workers                int
	noCheckpointer         bool
	// smoke checks that the benchmark works (every run accepted, every
	// check held) instead of measuring: `make test` runs it.
	smoke bool
}

// smokeN is the one task count of -smoke.
const smokeN = 10

func parseConfig(args []string) (config, error) {
	var c config
	var sizes, reps, oneWave, oneWaveReps, loopSizes, loopReps, hotSizes, hotReps string
	fs := flag.NewFlagSet("compare", flag.ExitOnError)
	fs.StringVar(&c.fanoutBin, "fanout", ".tmp/bin/fanout", "the fanout binary (go build ./cmd/fanout)")
	fs.StringVar(&c.langGraphDir, "langgraph", "bench/langgraph", "directory of bench.mjs and its installed node_modules")
	fs.StringVar(&c.node, "node", "node", "the Node.js binary")
	fs.StringVar(&c.tmpDir, "tmp-dir", "", "parent of the run's temporary directory (PostgreSQL cluster, credentials); default the system's")
	fs.StringVar(&c.pgBinDir, "pg-bin-dir", "", "directory of initdb/pg_ctl/postgres (default: found on PATH or /usr/lib/postgresql/*/bin)")
	fs.StringVar(&sizes, "n", "10,100,1000", "task counts, comma-separated (\"\": none)")
	fs.StringVar(&reps, "reps", "5,5,5", "measured repetitions per task count (after the warm-ups)")
	fs.StringVar(&oneWave, "one-wave", "10,100", "task counts of the one-wave case: the run's budget is exactly the sum of its tasks' token_budgets (\"\": none)")
	fs.StringVar(&oneWaveReps, "one-wave-reps", "5,5", "measured repetitions per task count of the one-wave case")
	fs.StringVar(&loopSizes, "loop-n", "1000", "task counts of the agent-loop case: each task makes -loop-calls sim calls in a row (\"\": none)")
	fs.StringVar(&loopReps, "loop-reps", "5", "measured repetitions per task count of the agent-loop case")
	fs.IntVar(&c.loopCalls, "loop-calls", 3, "sim calls (iterations) of each task of the agent-loop case, a tool call between two")
	fs.DurationVar(&c.loopLatency, "loop-latency", 500*time.Millisecond, "latency of each sim call of the agent-loop case")
	fs.StringVar(&hotSizes, "hot", strconv.Itoa(defaultHotN), "task counts of the hot-tenant case: N tasks in flight at once under one tenant with a budget, "+
		"each -hot-calls sim calls of -hot-latency; fanout alone (\"\": none)")
	fs.StringVar(&hotReps, "hot-reps", "3", "measured repetitions per task count of the hot-tenant case")
	fs.IntVar(&c.hotCalls, "hot-calls", 3, "sim calls (iterations) of each task of the hot-tenant case, a tool call between two")
	fs.DurationVar(&c.hotLatency, "hot-latency", time.Second, "latency of each sim call of the hot-tenant case")
	fs.IntVar(&c.warmup, "warmup", 1, "warm-up runs per task count and side, not measured")
	fs.DurationVar(&c.latency, "latency", 700*time.Millisecond, "latency of the one sim call each task makes (all but the agent-loop case)")
	fs.IntVar(&c.workers, "workers", 3, "fanout worker processes")
	fs.DurationVar(&c.runLimit, "run-timeout", 90*time.Second, "deadline of each measured run")
	fs.DurationVar(&c.total, "timeout", 20*time.Minute, "deadline of the whole benchmark (3m with -smoke)")
	fs.DurationVar(&c.pause, "pause", 300*time.Millisecond, "idle time between runs (not measured)")
	fs.BoolVar(&c.noCheckpointer, "langgraph-no-checkpointer", true, "also run LangGraph.js without a checkpointer, for reference")
	fs.BoolVar(&c.smoke, "smoke", false, fmt.Sprintf("check that the benchmark works, measuring nothing: N=%d in every case, one run per side, no warm-up; "+
		"every run must be accepted and pass the checks; prints no timings (make test runs it)", smokeN))
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.smoke {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for _, name := range []string{"n", "reps", "one-wave", "one-wave-reps", "loop-n", "loop-reps", "hot", "hot-reps", "warmup"} {
			if set[name] {
				return c, fmt.Errorf("-smoke sets -n, -one-wave, -loop-n and -hot %d, their -reps 1 and -warmup 0: drop -%s", smokeN, name)
			}
		}
		sizes, reps, c.warmup = strconv.Itoa(smokeN), "1", 0
		oneWave, oneWaveReps, loopSizes, loopReps, hotSizes, hotReps = sizes, reps, sizes, reps, sizes, reps
		if !set["timeout"] {
			c.total = 3 * time.Minute
		}
	}
	var err error
	if c.sizes, c.reps, err = optionalSizes("n", sizes, reps); err != nil {
		return c, err
	}
	if c.oneWave, c.oneWaveReps, err = optionalSizes("one-wave", oneWave, oneWaveReps); err != nil {
		return c, err
	}
	if c.loopSizes, c.loopReps, err = optionalSizes("loop-n", loopSizes, loopReps); err != nil {
		return c, err
	}
	if c.hotSizes, c.hotReps, err = optionalSizes("hot", hotSizes, hotReps); err != nil {
		return c, err
	}
	if len(c.sizes)+len(c.oneWave)+len(c.loopSizes)+len(c.hotSizes) == 0 {
		return c, errors.New("-n, -one-wave, -loop-n and -hot are all empty: nothing to measure")
	}
	if c.loopCalls < 2 {
		return c, fmt.Errorf("-loop-calls: an agent loop makes at least 2 calls, got %d", c.loopCalls)
	}
	if c.hotCalls < 1 {
		return c, fmt.Errorf("-hot-calls: a task makes at least 1 call, got %d", c.hotCalls)
	}
	if c.latency <= 0 || c.loopLatency <= 0 || c.hotLatency <= 0 {
		return c, fmt.Errorf("-latency %v, -loop-latency %v, -hot-latency %v: all must be > 0", c.latency, c.loopLatency, c.hotLatency)
	}
	if c.workers < 1 {
		return c, fmt.Errorf("-workers: need at least 1, got %d", c.workers)
	}
	if c.warmup < 0 {
		return c, fmt.Errorf("-warmup: must be >= 0, got %d", c.warmup)
	}
	return c, nil
}

// optionalSizes parses the task counts of an optional case (flag name,
// "" for none) and their repetitions.
func optionalSizes(name, sizes, reps string) ([]int, []int, error) {
	if strings.TrimSpace(sizes) == "" {
		return nil, nil, nil
	}
	n, err := fleet.Ints(sizes)
	if err != nil {
		return nil, nil, fmt.Errorf("-%s: %w", name, err)
	}
	r, err := fleet.Ints(reps)
	if err != nil {
		return nil, nil, fmt.Errorf("-%s's reps: %w", name, err)
	}
	if len(r) != len(n) {
		return nil, nil, fmt.Errorf("-%s: %d repetition counts for %d task counts", name, len(r), len(n))
	}
	return n, r, nil
}

// cases are the rows of the main report, in order: the main sizes, the
// one-wave ones, then the agent loop's (the hot-tenant case has a report of
// its own: hotCases).
func (c config) cases() []benchCase {
	var out []benchCase
	for i, n := range c.sizes {
		out = append(out, benchCase{n: n, calls: 1, latency: c.latency, reps: c.reps[i]})
	}
	for i, n := range c.oneWave {
		out = append(out, benchCase{n: n, calls: 1, latency: c.latency, reps: c.oneWaveReps[i], oneWave: true})
	}
	for i, n := range c.loopSizes {
		out = append(out, benchCase{n: n, calls: c.loopCalls, latency: c.loopLatency, reps: c.loopReps[i]})
	}
	return out
}

func run(ctx context.Context) error {
	cfg, err := parseConfig(os.Args[1:])
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, cfg.total, fmt.Errorf("the whole benchmark ran past -timeout %v", cfg.total))
	defer cancel()
	began := time.Now()
	if _, err := os.Stat(cfg.fanoutBin); err != nil {
		return fmt.Errorf("fanout binary: %w (build it: go build -o %s ./cmd/fanout)", err, cfg.fanoutBin)
	}
	cases := cfg.cases()
	if _, err := os.Stat(filepath.Join(cfg.langGraphDir, "node_modules", "@langchain", "langgraph")); err != nil && len(cases) > 0 {
		return fmt.Errorf("LangGraph.js is not installed in %s: run npm ci there (make bench-compare does)", cfg.langGraphDir)
	}

	tmp, err := fleet.TempDir(cfg.tmpDir, "fanout-bench-compare-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()

	db, err := fleet.StartPostgres(ctx, tmp, cfg.pgBinDir, cfg.fanoutBin, "langgraph")
	if err != nil {
		return err
	}
	defer db.Stop()

	// One API key and one set of peer credentials for every deployment.
	token, err := fleet.CreateKey(ctx, cfg.fanoutBin, db.OwnerURL, benchTenant, "bench-compare", "run,read", 0)
	if err != nil {
		return err
	}
	files, err := peer.GenerateDev(filepath.Join(tmp, "peer"))
	if err != nil {
		return fmt.Errorf("generate peer credentials: %w", err)
	}
	base := fanoutConfig{Bin: cfg.fanoutBin, Token: token, Tenant: benchTenant, Peer: files, NodeURL: db.NodeURL, OwnerURL: db.OwnerURL,
		Workers: cfg.workers, StartLimit: 60 * time.Second}
	versions := "LangGraph.js not run"
	if len(cases) > 0 {
		if versions, err = measureCases(ctx, cfg, base, db, cases, began); err != nil {
			return err
		}
	}
	if hot := cfg.hotCases(); len(hot) > 0 {
		if err := measureHot(ctx, cfg, base, tmp, hot, began); err != nil {
			return err
		}
	}
	if cfg.smoke {
		// A smoke run checks; it does not measure. Its timings, from one
		// cold run on a busy machine, would mean nothing.
		printSmoke(os.Stdout, cfg, versions, db.Settings)
	}
	fmt.Fprintf(os.Stderr, "bench-compare: %v in all\n", time.Since(began).Round(time.Second))
	return nil
}

// measureCases runs the main report's cases, fanout's (a deployment of base
// per sim latency) and LangGraph.js's interleaved, and prints the report
// unless cfg.smoke. It returns the versions of what LangGraph.js ran on.
func measureCases(ctx context.Context, cfg config, base fanoutConfig, db *fleet.Database, cases []benchCase, began time.Time) (string, error) {
	maxN := slices.MaxFunc(cases, func(a, b benchCase) int { return a.n - b.n }).n
	lg, err := startLangGraph(ctx, cfg.node, cfg.langGraphDir, db.Others["langgraph"], cfg.latency, 60*time.Second)
	if err != nil {
		return "", err
	}
	defer lg.stop()
	versions := describeVersions(ctx, cfg)
	loadBefore := fleet.LoadAverage()
	fmt.Fprintf(os.Stderr, "bench-compare: ready after %v; %s\n", time.Since(began).Round(time.Millisecond), db.Settings)

	results := make([]result, len(cases))
	// The sim call's latency is a worker's flag: the cases of one latency
	// run on one deployment, started for them and stopped after them.
	for _, group := range byLatency(cases) {
		fc := base
		fc.Capacity, fc.Latency = maxN, cases[group[0]].latency
		for _, i := range group {
			fc.Calls = max(fc.Calls, cases[i].calls)
		}
		if err := measure(ctx, cfg, fc, lg, cases, group, results, began); err != nil {
			return "", err
		}
	}
	if !cfg.smoke {
		printReport(os.Stdout, cfg, versions, db.Settings, cases, results)
		fmt.Fprintf(os.Stdout, "\nload average (1, 5, 15 min) on %d CPUs: %s before, %s after: the higher, the noisier\n",
			runtime.NumCPU(), loadBefore, fleet.LoadAverage())
	}
	return versions, nil
}

// byLatency groups the indexes of cases by their sim latency, in the order
// each latency first appears.
func byLatency(cases []benchCase) [][]int {
	var groups [][]int
	at := map[time.Duration]int{}
	for i, c := range cases {
		g, ok := at[c.latency]
		if !ok {
			g = len(groups)
			at[c.latency] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// measure starts a fanout deployment of fc and runs the cases of group on
// it and on lg, each side in turn, run by run, into results; then stops it.
func measure(ctx context.Context, cfg config, fc fanoutConfig, lg *langGraphSide, cases []benchCase, group []int,
	results []result, began time.Time) error {
	fo, err := startFanout(ctx, fc)
	if err != nil {
		return err
	}
	defer fo.stop()
	for _, i := range group {
		c := cases[i]
		r := &results[i]
		for rep := -cfg.warmup; rep < c.reps; rep++ { // reps below 0 are the warm-ups
			fr, err := fo.run(ctx, c, cfg.runLimit)
			if err != nil {
				return fmt.Errorf("fanout, %s: %w", c.label(), err)
			}
			if err := fleet.Sleep(ctx, cfg.pause); err != nil {
				return err
			}
			lgPG, err := lg.run(ctx, c, checkpointPostgres, cfg.runLimit)
			if err != nil {
				return err
			}
			if err := fleet.Sleep(ctx, cfg.pause); err != nil {
				return err
			}
			var lgNone time.Duration
			if cfg.noCheckpointer {
				if lgNone, err = lg.run(ctx, c, checkpointNone, cfg.runLimit); err != nil {
					return err
				}
				if err := fleet.Sleep(ctx, cfg.pause); err != nil {
					return err
				}
			}
			if rep < 0 {
				continue
			}
			r.fanout = append(r.fanout, fr.wall-c.ideal())
			r.lgPG = append(r.lgPG, lgPG-c.ideal())
			if cfg.noCheckpointer {
				r.lgNone = append(r.lgNone, lgNone-c.ideal())
			}
			r.phases = append(r.phases, fr.phases)
		}
		fmt.Fprintf(os.Stderr, "bench-compare: %s done (%v so far)\n", c.label(), time.Since(began).Round(time.Second))
	}
	return nil
}

// describeVersions names what is being compared: Node.js and the installed
// LangGraph.js packages.
func describeVersions(ctx context.Context, cfg config) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, cfg.node, "--version").Output()
	node := strings.TrimSpace(string(out))
	if err != nil {
		node = "unknown (" + err.Error() + ")"
	}
	var pkgs []string
	for _, p := range []string{"@langchain/langgraph", "@langchain/langgraph-checkpoint-postgres", "@langchain/core"} {
		pkgs = append(pkgs, p+" "+packageVersion(filepath.Join(cfg.langGraphDir, "node_modules", p, "package.json")))
	}
	return "Node.js " + node + ", " + strings.Join(pkgs, ", ")
}

func packageVersion(path string) string {
	var pkg struct{ Version string }
	b, err := os.ReadFile(path)
	if err != nil || json.Unmarshal(b, &pkg) != nil || pkg.Version == "" {
		return "?"
	}
	return pkg.Version
}
