package orchestrator

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// TestAHedgeNeedsTheForecastsRoom: a hedge of a task in flight is admitted
// only when what is left, less what the tasks in flight still need, covers
// the task's forecast once more; never for a task not in flight, nor while
// the tasks in flight are wound down (docs/budget.md#hedged-tasks).
func TestAHedgeNeedsTheForecastsRoom(t *testing.T) {
	f := forecasterOf(10_000, 0, 500, 3_000, 3_000, 3_000) // 10,000 to claim: the caps fit
	for i := range 3 {
		if v, _, _ := f.admit(i); v != admit {
			t.Fatalf("task %d: %v, want admitted", i, v)
		}
	}
	if ok, need, room := f.admitHedge(2); ok || need != 3_000 || room != 1_000 {
		t.Errorf("hedge of task 2 with 9,000 of 10,000 committed: %v (need %d, room %d); want refused, need 3,000, room 1,000", ok, need, room)
	}
	f.ended(0, 500, 600, true) // the forecast is now 600 a task
	if ok, need, room := f.admitHedge(2); !ok || need != 600 || room != 9_500-1_200 {
		t.Errorf("hedge of task 2 once a task answered with a peak of 600: %v (need %d, room %d); want admitted", ok, need, room)
	}
	if ok, _, _ := f.admitHedge(0); ok {
		t.Error("hedge of task 0, which has ended: admitted")
	}
	f.wound = true
	if ok, _, _ := f.admitHedge(2); ok {
		t.Error("hedge while the tasks in flight are wound down: admitted")
	}
}

// TestHedgeThreshold: the earlier of after and latency_factor × the median
// of the peers that answered, once min_peers have; the factor is 3 when
// neither is set, and off when after alone is.
func TestHedgeThreshold(t *testing.T) {
	peers := &peerDurations{}
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	end := func(ms int, st fanoutv1.TaskStatus) {
		peers.record(&fanoutv1.TaskOutcome{Status: st, StartedAt: timestamppb.New(t0),
			FinishedAt: timestamppb.New(t0.Add(time.Duration(ms) * time.Millisecond))})
	}
	if _, _, ok := hedgeThreshold(&fanoutv1.Hedge{}, peers); ok {
		t.Error("a threshold before any peer answered")
	}
	end(100, fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED)
	end(300, fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED)
	end(9_000, fanoutv1.TaskStatus_TASK_STATUS_FAILED) // did not answer: not a peer
	if _, _, ok := hedgeThreshold(&fanoutv1.Hedge{}, peers); ok {
		t.Error("a threshold with 2 peers of the 3 the default needs")
	}
	end(200, fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED)
	for _, c := range []struct {
		h    *fanoutv1.Hedge
		want time.Duration
		why  string
	}{
		{&fanoutv1.Hedge{}, 600 * time.Millisecond, "3 × the median 200ms of 3 tasks that answered"},
		{&fanoutv1.Hedge{LatencyFactor: 2, MinPeers: 1}, 400 * time.Millisecond, "2 × the median 200ms of 3 tasks that answered"},
		{&fanoutv1.Hedge{After: durationpb.New(5 * time.Second)}, 5 * time.Second, "after 5s"},
		{&fanoutv1.Hedge{After: durationpb.New(5 * time.Second), LatencyFactor: 3}, 600 * time.Millisecond, "3 × the median 200ms of 3 tasks that answered"},
		{&fanoutv1.Hedge{After: durationpb.New(500 * time.Millisecond), LatencyFactor: 3}, 500 * time.Millisecond, "after 500ms"},
		{&fanoutv1.Hedge{MinPeers: 4, LatencyFactor: 3}, 0, ""},
	} {
		got, why, ok := hedgeThreshold(c.h, peers)
		if got != c.want || why != c.why || ok != (c.want > 0) {
			t.Errorf("hedge %v: threshold %s (%q, %v), want %s (%q)", c.h, got, why, ok, c.want, c.why)
		}
	}
}
