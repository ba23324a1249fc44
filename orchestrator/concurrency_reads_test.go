package orchestrator_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/llm"
)

// countedLimits counts the reads of the limits it wraps; once stuck is
// closed, every later read waits for its context (a database that hangs).
type countedLimits struct {
	src     orchestrator.RateLimits
	reads   atomic.Int64
	stuck   chan struct{}
	stickMu sync.Once
}

func (c *countedLimits) RateLimits(ctx context.Context, provider, model string) (orchestrator.RateLimit, error) {
	c.reads.Add(1)
	select {
	case <-c.stuck:
		<-ctx.Done()
		return orchestrator.RateLimit{}, ctx.Err()
	default:
	}
	return c.src.RateLimits(ctx, provider, model)
}

func (c *countedLimits) stick() { c.stickMu.Do(func() { close(c.stuck) }) }

func countedOrchestrator(t *testing.T, b *testBundle, w string) (*node, *countedLimits) {
	t.Helper()
	c := &countedLimits{stuck: make(chan struct{})}
	n := b.orchestratorWith(t, "o", sizedConfig, func(p *orchestrator.EngineParams) {
		c.src = p.RateLimits
		p.RateLimits = c
	}, w)
	return n, c
}

// TestRunsOnOneLimitShareOneRead: docs/operations.md#concurrency-from-the-rate-limits.
// Four runs of one orchestrator sized from the same provider and model
// read the limits (and count the runs sharing them) once per interval
// between them, not once each: the reads over the runs' lifetime are about
// the intervals that passed, not four times as many.
func TestRunsOnOneLimitShareOneRead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.learnLimit(t, 600, 0)
	w, _ := b.worker(t, "w", llm.SimConfig{Latency: 300 * time.Millisecond, FinishAfter: 2}, 64)
	n, c := countedOrchestrator(t, b, w)
	began := time.Now()
	var ids []string
	for _, key := range []string{"read-a", "read-b", "read-c", "read-d"} {
		ids = append(ids, start(t, n, spec(key, 20, 1_000_000)))
	}
	for _, id := range ids {
		watchAll(t, n.client, id)
	}
	intervals := time.Since(began) / sizedConfig.ConcurrencyInterval
	reads := c.reads.Load()
	t.Logf("%d reads in %d intervals, 4 runs", reads, intervals)
	// One a interval, and one more for each run's start at most: four runs
	// reading each would be four times the intervals.
	if most := int64(intervals) + 4 + 2; reads > most {
		t.Errorf("%d reads of the limits in %d intervals by 4 runs: want at most %d, one per interval between them",
			reads, intervals, most)
	}
}

// TestTheDriveLoopNeverWaitsForTheLimits: docs/operations.md#concurrency-from-the-rate-limits.
// Once the run has chosen its first concurrency, every read of the limits
// hangs; the run still dispatches, ends its tasks and finishes on time:
// its recomputes take the last value read, and the reads go on in the
// background.
func TestTheDriveLoopNeverWaitsForTheLimits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.learnLimit(t, 600, 0)
	w, _ := b.worker(t, "w", llm.SimConfig{Latency: 200 * time.Millisecond, FinishAfter: 2}, 64)
	n, c := countedOrchestrator(t, b, w)
	id := start(t, n, spec("stuck-reads", 30, 1_000_000))
	c.stick()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second) // a hung read waits 30 s
	defer cancel()
	stream, err := n.client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: id})
	if err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatalf("the run did not end while the limits' reads hung: %v", err)
		}
		if fin := msg.GetEvent().GetRunFinished(); fin != nil {
			if st := fin.GetState(); st != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
				t.Errorf("run ended %s", st)
			}
			break
		}
	}
	if c.reads.Load() < 2 {
		t.Errorf("%d reads of the limits: want Submit's and a recompute's (which hung)", c.reads.Load())
	}
}
