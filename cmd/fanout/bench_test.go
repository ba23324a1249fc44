package main

// Benchmarks of the whole service: worker processes (this test binary
// re-executed as `fanout worker`), an orchestrator in this process, real
// PostgreSQL and gRPC. Run them with
//
//	go test -run '^$' -bench . -benchtime 1x ./cmd/fanout/

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/node"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// startEngine serves an orchestrator in this process through the binary's
// own wiring (package node) with cfg, for limits that have no flag, and
// sets c.orch.
func (c *cluster) startEngine(tb testing.TB, cfg orchestrator.Config) {
	tb.Helper()
	addrs := make([]string, len(c.workers))
	for i, w := range c.workers {
		addrs[i] = w.addr
	}
	orchTrust, _, _, err := node.DevTrust(filepath.Dir(testPeer(tb).CA))
	if err != nil {
		tb.Fatal(err)
	}
	m := node.NewMain(node.Config{
		Backend: node.BackendConfig{DatabaseURL: storetest.NodeURL(tb, c.url), SweepInterval: time.Second,
			PollInterval: 200 * time.Millisecond, GroupCommit: true, Logger: newLogger(io.Discard, "error")},
		Orchestrator: &node.OrchestratorConfig{Workers: strings.Join(addrs, ","), Engine: cfg, Trust: orchTrust,
			Auth: node.CallerAuth{None: true}},
	})
	if err := m.Open(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = m.Close(ctx)
	})
	addr := m.Orchestrator().Addr()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	c.orch = &orchestratorProc{addr: addr, logs: &logTail{}, client: fanoutv1.NewOrchestratorServiceClient(conn)}
}

func (c *cluster) held(tb testing.TB, runID string) int {
	tb.Helper()
	var n int
	if err := c.pool.QueryRow(context.Background(), `SELECT count(*) FROM reservation
		WHERE run_id = $1 AND state = 'held'`, runID).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}

// benchRuns numbers the benchmarks' runs, so that every run has its own
// idempotency key even when the framework calls a benchmark again.
var benchRuns atomic.Int64

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkCancellationLatency: 100 subagents on 3 worker processes are all
// in a (30 s) model call; the benchmark then exhausts the run through the
// ledger, as a sibling's last reservation would, and measures, per subagent,
// the exhausting commit -> the end of its cancelled call (sim log).
func BenchmarkCancellationLatency(b *testing.B) {
	const n = 100
	sim := []string{"--sim-latency", "30s", "--sim-tool-calls", "1", "--sim-finish-after", "3"}
	c := startWorkers(b, [][]string{sim, sim, sim})
	c.startEngine(b, orchestrator.Config{})
	ledger := store.NewLedger(c.pool)
	var all []time.Duration
	var reserveRTT []time.Duration
	for range b.N {
		s := e2eSpec(fmt.Sprintf("cancel-latency-%d", benchRuns.Add(1)), n, 1_000_000)
		s.Limits.MaxConcurrency = n
		for _, t := range s.Tasks {
			t.TokenBudget = 1_000_000
		}
		started, err := c.orch.client.StartRun(context.Background(), &fanoutv1.StartRunRequest{Spec: s})
		if err != nil {
			b.Fatal(err)
		}
		runID := started.GetRunId()
		waitFor(b, 60*time.Second, "every subagent in its model call", func() (bool, string) {
			h := c.held(b, runID)
			return h == n, strconv.Itoa(h) + " held"
		})
		acct, err := c.orch.client.GetRun(context.Background(), &fanoutv1.GetRunRequest{RunId: runID})
		if err != nil {
			b.Fatal(err)
		}
		var task0, attempt int64
		var tenant string
		if err := c.pool.QueryRow(context.Background(), `SELECT account_id, attempt, tenant_id FROM account
			WHERE run_id = $1 AND task_id = 't00'`, runID).Scan(&task0, &attempt, &tenant); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		res, err := ledger.Reserve(context.Background(), budget.ReserveParams{Account: budget.AccountID(task0),
			RunID: runID, TenantID: tenant, Attempt: attempt,
			Want: acct.GetRun().GetBudget().GetAvailableTokens(), Min: 1, Holder: "bench", TTL: time.Minute})
		// The commit happened between t0 and the reply; latencies are taken
		// from t0, so they are upper bounds, by at most the reserve's RTT.
		replied := time.Now()
		if err != nil {
			b.Fatal(err)
		}
		reserveRTT = append(reserveRTT, replied.Sub(t0))
		var calls []call
		waitFor(b, 60*time.Second, "every call cancelled", func() (bool, string) {
			calls = calls[:0]
			for _, w := range c.workers {
				calls = append(calls, w.calls(b, runID)...)
			}
			return len(calls) == n, strconv.Itoa(len(calls)) + " calls ended"
		})
		for _, cl := range calls {
			if !cl.Cancelled {
				b.Errorf("call %s/%d ended without being cancelled", cl.TaskID, cl.Iteration)
			}
			all = append(all, cl.End.Sub(t0))
		}
		if _, err := ledger.Void(context.Background(), res.ID, res.Lease.Generation, ""); err != nil {
			b.Fatal(err)
		}
		watchAll(b, c.orch.client, runID, nil)
	}
	slices.Sort(all)
	p50, p99, mx := percentile(all, 0.50), percentile(all, 0.99), all[len(all)-1]
	b.ReportMetric(ms(p50), "p50-ms")
	b.ReportMetric(ms(p99), "p99-ms")
	b.ReportMetric(ms(mx), "max-ms")
	slices.Sort(reserveRTT)
	fmt.Printf("\ncancellation latency, exhausting reserve sent -> cancelled call ended (sim log), 3 worker processes\n"+
		"%-10s %8s %8s %8s %8s %14s\n%-10d %8.1f %8.1f %8.1f %8.1f %14.1f\n",
		"subagents", "min ms", "p50 ms", "p99 ms", "max ms", "reserve rtt ms",
		len(all), ms(all[0]), ms(p50), ms(p99), ms(mx), ms(reserveRTT[len(reserveRTT)/2]))
}

// vmRSS returns a process's resident set in bytes.
func vmRSS(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// memSample is memory at the moment the most subagents of a run were in a call.
type memSample struct {
	running   int    // reservations held at once (subagents in a model call)
	heap      uint64 // this process's (the orchestrator's) heap in use
	workerRSS int64  // the worker processes' resident sets, summed
}

// sampleMemory samples until stop is closed and returns the sample taken
// when the most subagents were running.
func (c *cluster) sampleMemory(tb testing.TB, runID string, stop <-chan struct{}) memSample {
	var best memSample
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return best
		case <-tick.C:
		}
		h := c.held(tb, runID)
		if h <= best.running {
			continue
		}
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		s := memSample{running: h, heap: m.HeapInuse}
		for _, w := range c.workers {
			s.workerRSS += vmRSS(w.cmd.Process.Pid)
		}
		best = s
	}
}

// BenchmarkFanout: N tasks x I iterations, every call reserved and settled,
// with the sim at a fixed 200 ms latency and concurrency >= N, on 3 worker
// processes. The ideal wall time is I x 200 ms.
func BenchmarkFanout(b *testing.B) {
	const latency = 200 * time.Millisecond
	type row struct {
		tasks, iterations               int
		wall, ideal                     time.Duration
		running                         int
		heapPerSubagent, rssPerSubagent float64
	}
	var rows []row
	var mu sync.Mutex
	for _, iters := range []int{1, 3} {
		b.Run("iterations="+strconv.Itoa(iters), func(b *testing.B) {
			sim := []string{"--sim-latency", latency.String(), "--sim-tool-calls", "1",
				"--sim-finish-after", strconv.Itoa(iters), "--capacity", "400"}
			c := startWorkers(b, [][]string{sim, sim, sim})
			c.startEngine(b, orchestrator.Config{MaxTasks: 1000, MaxConcurrency: 1000})
			for _, n := range []int{100, 1000} {
				b.Run("tasks="+strconv.Itoa(n), func(b *testing.B) {
					var walls []time.Duration
					var mem memSample
					var heap0 uint64
					var rss0 int64
					for i := range b.N {
						s := e2eSpec(fmt.Sprintf("fanout-%d-%d-%d", iters, n, benchRuns.Add(1)), n, 1_000_000_000)
						s.Limits.MaxConcurrency = int32(n)
						s.Budget.MinReservationTokens = 1
						if i == 0 {
							runtime.GC()
							var m runtime.MemStats
							runtime.ReadMemStats(&m)
							heap0 = m.HeapInuse
							rss0 = 0
							for _, w := range c.workers {
								rss0 += vmRSS(w.cmd.Process.Pid)
							}
						}
						b.StartTimer()
						start := time.Now()
						ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
						stream, err := c.orch.client.Run(ctx, &fanoutv1.RunRequest{Spec: s})
						if err != nil {
							b.Fatal(err)
						}
						var runID string
						stop := make(chan struct{})
						sampled := make(chan memSample, 1)
						var evs []*fanoutv1.RunEvent
						for {
							m, err := stream.Recv()
							if errors.Is(err, io.EOF) {
								break
							}
							if err != nil {
								b.Fatal(err)
							}
							evs = append(evs, m.GetEvent())
							if runID == "" {
								runID = m.GetEvent().GetRunId()
								if i == 0 {
									go func() { sampled <- c.sampleMemory(b, runID, stop) }()
								}
							}
						}
						wall := time.Since(start)
						b.StopTimer()
						cancel()
						close(stop)
						if i == 0 {
							mem = <-sampled
						}
						fin := evs[len(evs)-1].GetRunFinished()
						if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
							b.Fatalf("run ended %s (%s)", fin.GetState(), fin.GetCancelCause())
						}
						for _, o := range fin.GetResult().GetTasks() {
							if o.GetSummary().GetIterations() != int32(iters) {
								b.Fatalf("task %s made %d iterations, want %d", o.GetTaskId(), o.GetSummary().GetIterations(), iters)
							}
						}
						walls = append(walls, wall)
						if i == 0 {
							b.Logf("where the time goes: %s", phases(evs))
						}
					}
					slices.Sort(walls)
					wall := walls[len(walls)/2]
					ideal := time.Duration(iters) * latency
					b.ReportMetric(float64(wall)/float64(ideal), "wall/ideal")
					b.ReportMetric(ms(wall-ideal), "extra-ms")
					r := row{tasks: n, iterations: iters, wall: wall, ideal: ideal, running: mem.running}
					if mem.running > 0 {
						r.heapPerSubagent = float64(int64(mem.heap)-int64(heap0)) / float64(mem.running)
						r.rssPerSubagent = float64(mem.workerRSS-rss0) / float64(mem.running)
						b.ReportMetric(r.heapPerSubagent/1024, "orch-heap-KiB/subagent")
						b.ReportMetric(r.rssPerSubagent/1024, "worker-rss-KiB/subagent")
					}
					mu.Lock()
					rows = slices.DeleteFunc(rows, func(o row) bool { return o.tasks == n && o.iterations == iters })
					rows = append(rows, r)
					mu.Unlock()
				})
			}
		})
	}
	fmt.Printf("\nfan-out overhead, sim latency %v, 3 worker processes, every call reserved and settled\n", latency)
	fmt.Printf("%6s %5s %9s %9s %10s %9s %8s %22s %24s\n", "tasks", "iter", "ideal ms", "wall ms", "wall/ideal",
		"extra ms", "running", "orch heap KiB/subagent", "worker RSS KiB/subagent")
	for _, r := range rows {
		fmt.Printf("%6d %5d %9.0f %9.0f %10.2f %9.0f %8d %22.1f %24.1f\n", r.tasks, r.iterations, ms(r.ideal), ms(r.wall),
			float64(r.wall)/float64(r.ideal), ms(r.wall-r.ideal), r.running, r.heapPerSubagent/1024, r.rssPerSubagent/1024)
	}
}

// phases summarises a run's event times (stored by the database): when the
// last task was queued, the first and last started, the first and last
// finished, and the run finished, from RunStarted.
func phases(evs []*fanoutv1.RunEvent) string {
	t0 := evs[0].GetTime().AsTime()
	var lastQueued, firstStarted, lastStarted, firstFinished, lastFinished, runFinished time.Duration
	first := func(d *time.Duration, v time.Duration) {
		if *d == 0 || v < *d {
			*d = v
		}
	}
	last := func(d *time.Duration, v time.Duration) { *d = max(*d, v) }
	for _, ev := range evs {
		at := ev.GetTime().AsTime().Sub(t0)
		switch {
		case ev.GetTaskQueued() != nil:
			last(&lastQueued, at)
		case ev.GetTaskStarted() != nil:
			first(&firstStarted, at)
			last(&lastStarted, at)
		case ev.GetTaskFinished() != nil:
			first(&firstFinished, at)
			last(&lastFinished, at)
		case ev.GetRunFinished() != nil:
			runFinished = at
		}
	}
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("%d events; from RunStarted: last queued %v, started %v..%v, finished %v..%v, run finished %v",
		len(evs), r(lastQueued), r(firstStarted), r(lastStarted), r(firstFinished), r(lastFinished), r(runFinished))
}
