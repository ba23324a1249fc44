package orchestrator_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/llm"
)

// commitClock is a span processor that tells when the transaction that
// wrote a run's RunFinished committed: the end of the COMMIT span that
// follows the finishRun statement under the same parent (the store traces
// every statement, store/telemetry.go). The COMMIT span ends when its reply
// arrived: the end is durable and visible to any reader from then on.
type commitClock struct {
	mu      sync.Mutex
	parent  trace.SpanID // of the last finishRun statement
	pending bool         // its COMMIT not seen yet
	at      time.Time    // the end of that COMMIT
}

func (c *commitClock) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (c *commitClock) Shutdown(context.Context) error                  { return nil }
func (c *commitClock) ForceFlush(context.Context) error                { return nil }

func (c *commitClock) OnEnd(s sdktrace.ReadOnlySpan) {
	c.mu.Lock()
	defer c.mu.Unlock()

	switch s.Name() {
	case "WITH":
		for _, a := range s.Attributes() {
			if a.Key == "db.query.text" && strings.Contains(a.Value.AsString(), "finished_at = now()") {
				c.parent, c.pending = s.Parent().SpanID(), true
			}
		}
	case "COMMIT":
		if c.pending && s.Parent().SpanID() == c.parent {
			c.at, c.pending = s.EndTime(), false
		}
	}
}

// committed returns when the last RunFinished's transaction committed.
func (c *commitClock) committed() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at, !c.at.IsZero() && !c.pending
}

func (c *commitClock) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.parent, c.pending, c.at = trace.SpanID{}, false, time.Time{}
}

// recvUntilEnd reads a stream until its RunFinished and returns when it
// arrived; recv returns the next event.
func recvUntilEnd(recv func() (*fanoutv1.RunEvent, error), started chan<- string) (time.Time, *fanoutv1.RunEvent, error) {
	for {
		ev, err := recv()
		if errors.Is(err, io.EOF) {
			return time.Time{}, nil, errors.New("the stream ended without RunFinished")
		}
		if err != nil {
			return time.Time{}, nil, err
		}
		if started != nil && ev.GetRunStarted() != nil {
			started <- ev.GetRunId()
			started = nil
		}
		if ev.GetRunFinished() != nil {
			return time.Now(), ev, nil
		}
	}
}

// BenchmarkRunFinishedLatency measures, through the real wiring (an
// orchestrator and a worker with the sim model, over gRPC), the time from
// the commit of a run's RunFinished to its arrival at the Run caller and
// at a WatchRun follower on the same orchestrator (issue 43: within 5ms).
// Each op is one run of 10 one-call tasks of 20ms.
//
//	go test -run '^$' -bench RunFinishedLatency -benchtime 30x ./orchestrator/
func BenchmarkRunFinishedLatency(b *testing.B) {
	clock := &commitClock{}
	old := otel.GetTracerProvider()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(clock))
	otel.SetTracerProvider(tp)
	b.Cleanup(func() {
		otel.SetTracerProvider(old)
		_ = tp.Shutdown(context.Background())
	})

	bundle := setup(b)
	w, _ := bundle.worker(b, "w1", llm.SimConfig{Latency: 20 * time.Millisecond, FinishAfter: 1}, 64)
	n := bundle.orchestrator(b, "o1", orchestrator.Config{}, w)
	watcher := fanoutv1.NewOrchestratorServiceClient(dial(b, n.addr))

	var toRun, toWatch, stamped []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		clock.reset()
		ctx, cancel := context.WithTimeout(b.Context(), patience)
		s := spec(fmt.Sprintf("finlat-%d", i), 10, 100_000)
		for _, t := range s.Tasks {
			t.MaxIterations = 1
		}
		stream, err := n.client.Run(ctx, &fanoutv1.RunRequest{Spec: s})
		if err != nil {
			b.Fatal(err)
		}
		started := make(chan string, 1)
		watched := make(chan time.Time, 1)
		watchErr := make(chan error, 1)
		go func() {
			runID := <-started
			ws, err := watcher.WatchRun(withTenant(ctx, "t1"), &fanoutv1.WatchRunRequest{RunId: runID})
			if err != nil {
				watchErr <- err
				return
			}
			at, _, err := recvUntilEnd(func() (*fanoutv1.RunEvent, error) {
				m, err := ws.Recv()
				return m.GetEvent(), err
			}, nil)
			if err != nil {
				watchErr <- err
				return
			}
			watched <- at
		}()
		ranAt, fin, err := recvUntilEnd(func() (*fanoutv1.RunEvent, error) {
			m, err := stream.Recv()
			return m.GetEvent(), err
		}, started)
		if err != nil {
			b.Fatal(err)
		}
		var watchedAt time.Time
		select {
		case watchedAt = <-watched:
		case err := <-watchErr:
			b.Fatal(err)
		}
		cancel()
		commit, ok := clock.committed()
		if !ok {
			b.Fatal("no commit of a RunFinished traced")
		}
		toRun = append(toRun, ranAt.Sub(commit))
		toWatch = append(toWatch, watchedAt.Sub(commit))
		stamped = append(stamped, ranAt.Sub(fin.GetTime().AsTime()))
	}
	b.StopTimer()
	report := func(name string, ds []time.Duration) {
		slices.Sort(ds)
		q := func(p float64) float64 { return float64(ds[int(p*float64(len(ds)-1))]) / 1e6 }
		b.ReportMetric(q(0.5), name+"-p50-ms")
		b.ReportMetric(q(0.9), name+"-p90-ms")
		b.ReportMetric(q(1), name+"-max-ms")
	}
	report("commit-to-run", toRun)
	report("commit-to-watch", toWatch)
	report("stamp-to-run", stamped)
}

// TestEndReachesFollowersWithoutThePoll: a run's end reaches the Run
// caller and a WatchRun follower on the orchestrator that ended it through
// that orchestrator's own signal (Engine.finished hands its closing events
// to the followers), not through what finds what other nodes append (the
// notifications, off here, and the poll): with the poll an hour apart,
// both streams still get their RunFinished, and well before the poll's
// first tick.
func TestEndReachesFollowersWithoutThePoll(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Calls of 300ms: the WatchRun stream opens (on the Run stream's
	// RunStarted) well before the end, which it must then be handed, not
	// read with the run's history.
	w, _ := b.worker(t, "w1", llm.SimConfig{Latency: 300 * time.Millisecond, FinishAfter: 1}, 8)
	n := b.orchestratorWith(t, "o1", orchestrator.Config{WatchPollInterval: time.Hour},
		func(p *orchestrator.EngineParams) { p.Events = nil }, w)
	ctx, cancel := context.WithTimeout(t.Context(), patience)
	defer cancel()
	stream, err := n.client.Run(ctx, &fanoutv1.RunRequest{Spec: spec("end-no-poll", 3, 100_000)})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan string, 1)
	type end struct {
		stream string
		err    error
	}
	ends := make(chan end, 2)
	go func() {
		_, _, err := recvUntilEnd(func() (*fanoutv1.RunEvent, error) {
			m, err := stream.Recv()
			return m.GetEvent(), err
		}, started)
		ends <- end{"Run", err}
	}()
	go func() {
		var runID string
		select {
		case runID = <-started:
		case <-ctx.Done():
			ends <- end{"WatchRun", fmt.Errorf("no RunStarted on the Run stream: %w", context.Cause(ctx))}
			return
		}
		ws, err := n.client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID})
		if err == nil {
			_, _, err = recvUntilEnd(func() (*fanoutv1.RunEvent, error) {
				m, err := ws.Recv()
				return m.GetEvent(), err
			}, nil)
		}
		ends <- end{"WatchRun", err}
	}()
	// The run takes well under a second; the poll ticks after an hour.
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for range 2 {
		select {
		case e := <-ends:
			if e.err != nil {
				t.Errorf("%s stream: %v", e.stream, e.err)
			}
		case <-deadline.C:
			t.Fatal("no RunFinished within 20s on the Run stream and the WatchRun stream: " +
				"the run's end did not reach this node's followers except by the poll")
		}
	}
}
