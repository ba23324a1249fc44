// Command sched measures how close a fleet's model calls come to a
// provider key's rate limit, and how many of them the provider refuses:
// runs of many tasks on one key, all started at once, against an
// OpenAI-compatible mock with that key's limits (issue 45's scheduler
// benchmark). `make bench-sched` runs it; bench/README.md ("bench/sched")
// says what it measures and how to read its tables.
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
	"strings"
	"syscall"
	"time"

	"github.com/fanout/fanout/bench/internal/fleet"
	"github.com/fanout/fanout/peer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-sched: %v\n", err)
		os.Exit(1)
	}
}

// Modes: how the workers know the key's limits.
const (
	// modeLearn: no limit flags; the workers learn the limits from the
	// provider's response headers (where the binary does).
	modeLearn = "learn"
	// modeFlags: --openai-rpm and --openai-tpm state the key's limits, as
	// an operator sets them on main.
	modeFlags = "flags"
)

var modes = []string{modeLearn, modeFlags}

type config struct {
	fanoutBin, tmpDir, pgBinDir string
	modes                       []string
	workers, orchestrators      int
	// runs runs of tasks tasks each, all started at once, per arm.
	runs, tasks int
	// fixed is the fixed arm's maxConcurrency.
	fixed int
	// rpm and tpm are the mock key's limits.
	rpm, tpm int64
	// Each answered call takes between latencyMin and latencyMax,
	// deterministic per request.
	latencyMin, latencyMax time.Duration
	total, runLimit        time.Duration
	sample                 time.Duration
	smoke                  bool
}

func parseConfig(args []string) (config, error) {
	var c config
	var names string
	fs := flag.NewFlagSet("sched", flag.ContinueOnError)
	fs.StringVar(&c.fanoutBin, "fanout", ".tmp/bin/fanout", "the fanout binary measured (go build ./cmd/fanout)")
	fs.StringVar(&c.tmpDir, "tmp-dir", "", "parent of the run's temporary directory (PostgreSQL cluster, credentials); default the system's")
	fs.StringVar(&c.pgBinDir, "pg-bin-dir", "", "directory of initdb/pg_ctl/postgres (default: found on PATH or /usr/lib/postgresql/*/bin)")
	fs.StringVar(&names, "mode", modeLearn, "how the workers know the key's limits, comma-separated: "+
		"learn (no limit flags: from the provider's headers) and/or flags (--openai-rpm/--openai-tpm)")
	fs.IntVar(&c.workers, "workers", 3, "worker processes")
	fs.IntVar(&c.orchestrators, "orchestrators", 1, "orchestrator processes (run i goes to orchestrator i mod their number)")
	fs.IntVar(&c.runs, "runs", 20, "runs of each arm, all started at once")
	fs.IntVar(&c.tasks, "tasks", 50, "tasks of each run")
	fs.IntVar(&c.fixed, "fixed", 16, "the fixed arm's maxConcurrency")
	fs.Int64Var(&c.rpm, "rpm", 600, "the mock key's requests per minute")
	fs.Int64Var(&c.tpm, "tpm", 200_000, "the mock key's tokens per minute")
	fs.DurationVar(&c.latencyMin, "latency-min", 300*time.Millisecond, "shortest latency of an answered call")
	fs.DurationVar(&c.latencyMax, "latency-max", 500*time.Millisecond, "longest latency of an answered call")
	fs.DurationVar(&c.total, "timeout", 2*time.Hour, "deadline of the whole harness")
	fs.DurationVar(&c.runLimit, "run-timeout", 30*time.Minute, "deadline of each arm's load (its runs' run_timeout too)")
	fs.DurationVar(&c.sample, "sample", 100*time.Millisecond, "how often the mock's counters are read")
	fs.BoolVar(&c.smoke, "smoke", false, "check that the harness works at a tiny size (2 runs of 5 tasks, short calls); the table it prints means nothing")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if c.modes, err = fleet.Names(names, "mode", modes); err != nil {
		return c, fmt.Errorf("-mode: %w", err)
	}
	if c.smoke {
		c.runs, c.tasks = 2, 5
		c.latencyMin, c.latencyMax = 20*time.Millisecond, 40*time.Millisecond
		c.runLimit = 2 * time.Minute
	}
	switch {
	case c.workers < 1 || c.orchestrators < 1:
		return c, fmt.Errorf("-workers %d, -orchestrators %d: need at least 1 of each", c.workers, c.orchestrators)
	case c.runs < 1 || c.tasks < 1 || c.fixed < 1:
		return c, fmt.Errorf("-runs %d, -tasks %d, -fixed %d: each must be at least 1", c.runs, c.tasks, c.fixed)
	case c.rpm < 1 || c.tpm < 1:
		return c, fmt.Errorf("-rpm %d, -tpm %d: the mock key has both limits", c.rpm, c.tpm)
	case c.latencyMin <= 0 || c.latencyMax < c.latencyMin:
		return c, fmt.Errorf("-latency-min %v, -latency-max %v: need 0 < min <= max", c.latencyMin, c.latencyMax)
	case c.sample <= 0:
		return c, errors.New("-sample must be > 0")
	}
	return c, nil
}

// harness is what every arm shares: the PostgreSQL and the peer
// credentials.
type harness struct {
	cfg   config
	db    *fleet.Database
	peer  peer.DevFiles
	began time.Time
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
	tmp, err := fleet.TempDir(cfg.tmpDir, "fanout-bench-sched-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	if h.db, err = fleet.StartPostgres(ctx, tmp, cfg.pgBinDir, cfg.fanoutBin); err != nil {
		return err
	}
	defer h.db.Stop()
	if h.peer, err = peer.GenerateDev(filepath.Join(tmp, "peer")); err != nil {
		return fmt.Errorf("generate peer credentials: %w", err)
	}
	fmt.Printf("# bench/sched: %s\n\n", describe(cfg))
	fmt.Printf("%s; %d CPUs; load average %s at the start\n", h.db.Settings, runtime.NumCPU(), fleet.LoadAverage())
	var failed []string
	for _, mode := range cfg.modes {
		var arms []*arm
		for _, fixed := range []int{cfg.fixed, 0} {
			a, err := h.runArm(ctx, mode, fixed)
			arms = append(arms, a)
			if err != nil {
				fmt.Fprintf(os.Stderr, "bench-sched: %s FAILED: %v\n", a.name(), err)
				failed = append(failed, a.name())
				if ctx.Err() != nil {
					break
				}
				continue
			}
			fmt.Fprintf(os.Stderr, "bench-sched: %s done in %v (%v so far)\n", a.name(), a.wall.Round(time.Second), time.Since(h.began).Round(time.Second))
		}
		printTable(os.Stdout, cfg, mode, arms)
		if ctx.Err() != nil {
			break
		}
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
	s := fmt.Sprintf("binary %s; modes %s; %d workers, %d orchestrator(s); %d runs of %d tasks at once per arm, one key; "+
		"mock limit %d RPM / %d TPM; calls of %v to %v",
		bin, strings.Join(c.modes, ","), c.workers, c.orchestrators, c.runs, c.tasks, c.rpm, c.tpm, c.latencyMin, c.latencyMax)
	if c.smoke {
		s += "; SMOKE (tiny sizes, nothing measured)"
	}
	return s
}
