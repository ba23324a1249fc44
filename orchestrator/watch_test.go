package orchestrator_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// elsewhere owns the runs these tests store by hand: a replica that is not
// running, whose runs the test's node only follows (its OrphanAfter is an
// hour, so it adopts none of them).
const elsewhere = "elsewhere"

// storedRun stores a RUNNING run of tenant t1 owned by elsewhere, with a
// RunStarted event, and returns its id.
func (b *testBundle) storedRun(t *testing.T, key string) string {
	t.Helper()
	runID := "run-" + key
	run := &fanoutv1.Run{RunId: runID, TenantId: "t1", IdempotencyKey: key,
		State: fanoutv1.RunState_RUN_STATE_RUNNING, Spec: spec(key, 1, 1000)}
	if _, _, err := b.backend.Runs().CreateRun(t.Context(), run, elsewhere); err != nil {
		t.Fatal(err)
	}
	if _, err := b.backend.Runs().AppendEvent(t.Context(), runID,
		&fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_RunStarted{RunStarted: &fanoutv1.RunStarted{}}}); err != nil {
		t.Fatal(err)
	}
	return runID
}

// queueTasks appends n TaskQueued events of about size bytes each in one
// write, as a run's first wave is written.
func (b *testBundle) queueTasks(t *testing.T, runID string, n, size int) {
	t.Helper()
	evs := make([]*fanoutv1.RunEvent, n)
	pad := strings.Repeat("x", size)
	for i := range evs {
		evs[i] = &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskQueued{TaskQueued: &fanoutv1.TaskQueued{
			TaskId: fmt.Sprintf("t%04d-%s", i, pad), DispatchIndex: int32(i)}}}
	}
	if _, err := b.backend.Runs().AppendEvents(t.Context(), runID, evs); err != nil {
		t.Fatal(err)
	}
}

// finishStored ends a stored run SUCCEEDED, with its RunFinished, and
// returns the RunFinished's sequence.
func (b *testBundle) finishStored(t *testing.T, runID string) int64 {
	t.Helper()
	if _, ended, err := b.backend.Runs().FinishRun(t.Context(), runID, elsewhere, fanoutv1.RunState_RUN_STATE_SUCCEEDED,
		"", &fanoutv1.JoinedResult{}); err != nil || !ended {
		t.Fatalf("finish run %s: ended %v, %v", runID, ended, err)
	}
	var last int64
	if err := b.pool.QueryRow(t.Context(), `SELECT last_sequence FROM fanout.run WHERE run_id = $1`, runID).Scan(&last); err != nil {
		t.Fatal(err)
	}
	return last
}

// checkSequences fails unless evs are the sequences from, from+1, ... in order.
func checkSequences(t *testing.T, what string, evs []*fanoutv1.RunEvent, from int64) {
	t.Helper()
	for i, ev := range evs {
		if want := from + int64(i); ev.GetSequence() != want {
			t.Fatalf("%s: event %d has sequence %d, want %d (no gap, no duplicate)", what, i, ev.GetSequence(), want)
		}
	}
}

// TestSlowReaderEndsNamingWhereToResume: a WatchRun reader that stops
// reading, more than 1,000 events behind, is ended RESOURCE_EXHAUSTED once
// it has stayed behind for WatchSlowAfter; the status names the limit and
// the after_sequence to resume from, which is the last event the reader
// got, and resuming from it gets every later event exactly once.
func TestSlowReaderEndsNamingWhereToResume(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := b.orchestrator(t, "o1", orchestrator.Config{WatchSlowAfter: 2 * time.Second, OrphanAfter: time.Hour})
	runID := b.storedRun(t, "slow-reader")
	b.queueTasks(t, runID, 3000, 300)
	last := b.finishStored(t, runID)

	// A client that buffers little, so that the server's Send blocks once
	// the reader stops: gRPC's default window grows to megabytes.
	conn, err := grpc.NewClient(n.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(tenantCtx(t, "t1"), patience)
	defer cancel()
	stream, err := fanoutv1.NewOrchestratorServiceClient(conn).WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	var got []*fanoutv1.RunEvent
	for range 10 {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		got = append(got, msg.GetEvent())
	}
	// The reader stops. The node ends the stream: it stops following the run.
	deadline := time.Now().Add(patience)
	for n.engine.Followers(runID) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("a reader stopped %d events behind is still followed after %v", last-10, patience)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// It reads again: what was buffered, then the end.
	var end error
	for {
		msg, err := stream.Recv()
		if err != nil {
			end = err
			break
		}
		got = append(got, msg.GetEvent())
	}
	checkSequences(t, "the slow stream", got, 1)
	st := status.Convert(end)
	if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "1000 events behind") {
		t.Fatalf("the slow stream ended %v, want RESOURCE_EXHAUSTED naming the limit of 1000 events", end)
	}
	var info *errdetails.ErrorInfo
	var quota *errdetails.QuotaFailure
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.QuotaFailure:
			quota = d
		}
	}
	if info == nil || info.GetReason() != "WATCH_READER_BEHIND" || quota == nil || len(quota.GetViolations()) != 1 {
		t.Fatalf("details %v, want ErrorInfo WATCH_READER_BEHIND and a QuotaFailure", st.Details())
	}
	resume, err := strconv.ParseInt(info.GetMetadata()["after_sequence"], 10, 64)
	if err != nil {
		t.Fatalf("ErrorInfo after_sequence: %v", err)
	}
	if received := got[len(got)-1].GetSequence(); resume != received {
		t.Fatalf("the status names after_sequence %d; the reader received up to %d", resume, received)
	}
	if last-resume <= 1000 {
		t.Fatalf("the stream ended %d events behind, not more than 1000", last-resume)
	}
	// Resuming reads ~2,000 events at once, which a loaded machine may not
	// do within WatchSlowAfter: a client that is cut again resumes again
	// from the sequence its status names, as the status tells it to.
	rest := watchResuming(t, n.client, runID, resume)
	checkSequences(t, "the resumed stream", rest, resume+1)
	if len(rest) == 0 || rest[len(rest)-1].GetSequence() != last || rest[len(rest)-1].GetRunFinished() == nil {
		t.Fatalf("the resumed stream has %d events, want %d through the RunFinished", len(rest), last-resume)
	}
}

// TestFirstWaveReaderIsNotSlow: a reader that keeps up is not a slow
// reader even when a run's first wave puts it more than 1,000 events
// behind at once (1,000 TaskQueued in one write, then the tasks' next
// events): the rule is being behind for a time, not a gap at one instant.
// The node polls heads every 5ms (its fallback poll: a notification wakes
// the stream but does not tell it the head), so that it sees the gap
// before the stream has closed it.
func TestFirstWaveReaderIsNotSlow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := b.orchestrator(t, "o1", orchestrator.Config{WatchSlowAfter: 5 * time.Second, OrphanAfter: time.Hour,
		WatchFallbackPoll: 5 * time.Millisecond})
	runID := b.storedRun(t, "first-wave")
	ctx, cancel := context.WithTimeout(t.Context(), patience)
	defer cancel()
	stream, err := n.client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || first.GetEvent().GetRunStarted() == nil {
		t.Fatalf("first event %v, %v; want RunStarted", first.GetEvent(), err)
	}
	b.queueTasks(t, runID, 1000, 20)
	b.queueTasks(t, runID, 1000, 20)
	b.queueTasks(t, runID, 1000, 20)
	last := b.finishStored(t, runID)
	got := []*fanoutv1.RunEvent{first.GetEvent()}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("a reader that keeps up was ended after %d of %d events: %v", len(got), last, err)
		}
		got = append(got, msg.GetEvent())
	}
	checkSequences(t, "the stream", got, 1)
	if int64(len(got)) != last {
		t.Fatalf("got %d events, want %d", len(got), last)
	}
}

// getRunCounter counts GetRun calls.
type getRunCounter struct {
	orchestrator.RunStore
	n *atomic.Int64
}

func (s getRunCounter) GetRun(ctx context.Context, tenantID, runID string) (*fanoutv1.Run, error) {
	s.n.Add(1)
	return s.RunStore.GetRun(ctx, tenantID, runID)
}

// TestWatchReadsNoWholeRun: a stream starts from the run's head and state,
// not the whole run (issue 12: each WatchRun read the spec and results).
func TestWatchReadsNoWholeRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int64
	n := b.orchestratorWith(t, "o1", orchestrator.Config{OrphanAfter: time.Hour}, func(p *orchestrator.EngineParams) {
		p.Store = getRunCounter{p.Store, &calls}
	})
	runID := b.storedRun(t, "no-whole-run")
	b.queueTasks(t, runID, 3, 10)
	last := b.finishStored(t, runID)
	for range 3 {
		if evs := watchAllAfter(t, n.client, runID, 0); int64(len(evs)) != last {
			t.Fatalf("got %d events, want %d", len(evs), last)
		}
	}
	unknown, err := n.client.WatchRun(t.Context(), &fanoutv1.WatchRunRequest{RunId: "no-such-run"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unknown.Recv(); status.Code(err) != codes.NotFound {
		t.Fatalf("watch an unknown run: %v, want NOT_FOUND", err)
	}
	if got := calls.Load(); got != 0 {
		t.Fatalf("3 streams read the whole run %d times, want 0", got)
	}
}

// eventReads counts Events calls.
type eventReads struct {
	orchestrator.RunStore
	n *atomic.Int64
}

func (s eventReads) Events(ctx context.Context, tenantID, runID string, after int64, limit int) ([]*fanoutv1.RunEvent, error) {
	s.n.Add(1)
	return s.RunStore.Events(ctx, tenantID, runID, after, limit)
}

// TestStreamsShareReads: the streams of one run on a node read its new
// events from the store once for all of them, not once each (issue 12:
// 5,000 streams each reading on every move of the head kept a concurrent
// run waiting over 90s). Here 100 streams follow a run while 20 events are
// appended one at a time.
func TestStreamsShareReads(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var reads atomic.Int64
	n := b.orchestratorWith(t, "o1", orchestrator.Config{OrphanAfter: time.Hour}, func(p *orchestrator.EngineParams) {
		p.Store = eventReads{p.Store, &reads}
	})
	runID := b.storedRun(t, "shared-reads")
	const streams, appends = 100, 20
	ctx, cancel := context.WithTimeout(t.Context(), patience)
	defer cancel()
	got := make([]chan int64, streams)
	for i := range got {
		stream, err := n.client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID})
		if err != nil {
			t.Fatal(err)
		}
		got[i] = make(chan int64, appends+2)
		go func() {
			defer close(got[i])
			for {
				msg, err := stream.Recv()
				if err != nil {
					return
				}
				got[i] <- msg.GetEvent().GetSequence()
			}
		}()
	}
	next := func(what string, want int64) {
		t.Helper()
		for i, ch := range got {
			timer := time.NewTimer(patience)
			select {
			case seq := <-ch:
				if seq != want {
					t.Fatalf("stream %d: got sequence %d, want %d", i, seq, want)
				}
			case <-timer.C:
				t.Fatalf("stream %d: no %s within %v", i, what, patience)
			}
			timer.Stop()
		}
	}
	next("RunStarted", 1)
	before := reads.Load()
	for i := range appends {
		b.queueTasks(t, runID, 1, 10)
		next("new event", int64(i+2))
	}
	last := b.finishStored(t, runID)
	next("RunFinished", last)
	// Each append is read at most a few times (once by the first stream to
	// wake, again if the poll and a read cross), never once per stream.
	if r := reads.Load() - before; r > 3*(appends+1) {
		t.Fatalf("%d streams read the store %d times for %d appends, want at most %d", streams, r, appends+1, 3*(appends+1))
	}
}

// watchResuming reads the run's events after after to its end, resuming
// from the after_sequence a WATCH_READER_BEHIND status names each time the
// server ends the stream for falling behind (at most 20 times).
func watchResuming(t *testing.T, c fanoutv1.OrchestratorServiceClient, runID string, after int64) []*fanoutv1.RunEvent {
	t.Helper()
	var evs []*fanoutv1.RunEvent
	for range 20 {
		ctx, cancel := context.WithTimeout(tenantCtx(t, "t1"), patience)
		stream, err := c.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID, AfterSequence: after})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		for {
			msg, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				cancel()
				return evs
			}
			if err != nil {
				cancel()
				st := status.Convert(err)
				var info *errdetails.ErrorInfo
				for _, d := range st.Details() {
					if d, ok := d.(*errdetails.ErrorInfo); ok {
						info = d
					}
				}
				if st.Code() != codes.ResourceExhausted || info.GetReason() != "WATCH_READER_BEHIND" {
					t.Fatalf("watch run %s after %d: %v", runID, after, err)
				}
				if after, err = strconv.ParseInt(info.GetMetadata()["after_sequence"], 10, 64); err != nil {
					t.Fatalf("ErrorInfo after_sequence: %v", err)
				}
				if n := len(evs); n > 0 && evs[n-1].GetSequence() != after {
					t.Fatalf("cut after it received %d, the status names after_sequence %d", evs[n-1].GetSequence(), after)
				}
				break
			}
			evs = append(evs, msg.GetEvent())
		}
	}
	t.Fatalf("watch run %s: cut for falling behind 20 times", runID)
	return nil
}
