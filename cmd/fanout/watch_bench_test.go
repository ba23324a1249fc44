package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
)

// watchStreams is how many WatchRun streams BenchmarkWatchFanout opens on
// one run (issue 12: 5,000 streams on one run must leave a concurrent run's
// wall time within 20% of the quiet case), over connections of
// streamsPerConn (the server takes at most 256 per connection).
const (
	watchStreams   = 5000
	streamsPerConn = 250
)

// BenchmarkWatchFanout measures a 1-task run's wall time (Run, from the
// call to its RunFinished) quiet, then while watchStreams WatchRun streams
// follow another run, and quiet again, in one process run, and reports
// loaded/quiet (the goal: at most 1.2), for three watched runs: one with
// nothing to read (its tasks are all running), one that logs 2 events a
// second and one that logs 20 (10,000 and 100,000 events a second to
// deliver). The watched run is driven by "another replica" (this
// benchmark, through the store), so the node learns of its events by its
// poll.
//
//	go test -run '^$' -bench WatchFanout -benchtime 1x ./cmd/fanout/
//
// The streams' readers run in this process too, on the same cores as the
// server and the database; the machine's other load moves both figures.
func BenchmarkWatchFanout(b *testing.B) {
	c := startWorkers(b, [][]string{{"--sim-latency", "200ms", "--capacity", "64"}})
	c.startEngine(b, orchestrator.Config{OrphanAfter: time.Hour})
	for _, every := range []time.Duration{0, 500 * time.Millisecond, 50 * time.Millisecond} {
		name := "events-per-s=0"
		if every > 0 {
			name = fmt.Sprintf("events-per-s=%d", time.Second/every)
		}
		b.Run(name, func(b *testing.B) { benchWatchFanout(b, c, every) })
	}
}

// benchWatchFanout is one BenchmarkWatchFanout: the watched run logs an
// event every every (never when 0).
func benchWatchFanout(b *testing.B, c *cluster, every time.Duration) {
	ctx := context.Background()
	// The watched run: RUNNING, owned by a replica that is not this one.
	runs := store.NewRuns(c.pool)
	watched := fmt.Sprintf("watched-%d", benchRuns.Add(1))
	if _, _, err := runs.CreateRun(ctx, &fanoutv1.Run{RunId: watched, TenantId: "e2e", IdempotencyKey: watched,
		State: fanoutv1.RunState_RUN_STATE_RUNNING, Spec: e2eSpec(watched, 1, 1000)}, "elsewhere"); err != nil {
		b.Fatal(err)
	}
	if _, err := runs.AppendEvent(ctx, watched,
		&fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_RunStarted{RunStarted: &fanoutv1.RunStarted{}}}); err != nil {
		b.Fatal(err)
	}
	appendCtx, stopAppend := context.WithCancel(ctx)
	var appender sync.WaitGroup
	if every > 0 {
		appender.Go(func() {
			tick := time.NewTicker(every)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-appendCtx.Done():
					return
				case <-tick.C:
				}
				_, err := runs.AppendEvent(appendCtx, watched, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskQueued{
					TaskQueued: &fanoutv1.TaskQueued{TaskId: fmt.Sprintf("t%06d", i)}}})
				if err != nil && appendCtx.Err() == nil {
					b.Errorf("append to the watched run: %v", err)
					return
				}
			}
		})
	}
	defer func() { stopAppend(); appender.Wait() }()

	sample := func(label string, n int) []time.Duration {
		var walls []time.Duration
		for range n {
			s := e2eSpec(fmt.Sprintf("watch-fanout-%d", benchRuns.Add(1)), 1, 1_000_000)
			start := time.Now()
			runAll(b, c.orch.client, s)
			walls = append(walls, time.Since(start))
		}
		b.Logf("%s: %v", label, walls)
		return walls
	}

	quiet := sample("quiet", 5)
	delivered, closeStreams := openWatchers(b, c.orch.addr, watched, watchStreams)
	before := delivered.Load()
	t0 := time.Now()
	loaded := sample(fmt.Sprintf("%d streams", watchStreams), 5)
	rate := float64(delivered.Load()-before) / time.Since(t0).Seconds()
	closeStreams()
	quiet = append(quiet, sample("quiet again", 5)...)

	q, l := median(quiet), median(loaded)
	b.ReportMetric(ms(q), "quiet-ms")
	b.ReportMetric(ms(l), "loaded-ms")
	b.ReportMetric(float64(l)/float64(q), "loaded/quiet")
	b.ReportMetric(rate, "events-delivered/s")
	fmt.Printf("\nWatchRun fan-out (%s): a 1-task run (sim latency 200ms) quiet %.0f ms, with %d streams on another run %.0f ms: "+
		"loaded/quiet %.2f (goal <= 1.20); the streams received %.0f events/s\n",
		b.Name(), ms(q), watchStreams, ms(l), float64(l)/float64(q), rate)
}

// openWatchers opens n WatchRun streams on runID and returns the count of
// events they have received and a func that closes them and waits for
// their readers. It returns once every stream has received the run's
// first event, that is, once every stream is following the run.
func openWatchers(b *testing.B, addr, runID string, n int) (*atomic.Int64, func()) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var delivered atomic.Int64
	var readers sync.WaitGroup
	var conns []*grpc.ClientConn
	started := make(chan struct{}, n)
	for i := 0; i < n; i += streamsPerConn {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, conn)
		client := fanoutv1.NewOrchestratorServiceClient(conn)
		for range min(streamsPerConn, n-i) {
			stream, err := client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID})
			if err != nil {
				b.Fatal(err)
			}
			readers.Go(func() {
				first := true
				for {
					_, err := stream.Recv()
					if err != nil {
						if ctx.Err() == nil && !errors.Is(err, io.EOF) {
							b.Errorf("a watcher's stream ended: %v", err)
						}
						if first {
							started <- struct{}{}
						}
						return
					}
					delivered.Add(1)
					if first {
						first = false
						started <- struct{}{}
					}
				}
			})
		}
	}
	deadline := time.NewTimer(5 * time.Minute)
	defer deadline.Stop()
	for range n {
		select {
		case <-started:
		case <-deadline.C:
			b.Fatalf("%d WatchRun streams did not all start within 5m", n)
		}
	}
	return &delivered, func() {
		cancel()
		readers.Wait()
		for _, c := range conns {
			_ = c.Close()
		}
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
