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

// TestAHedgeIsInFlightToo: a hedge admitted is a second attempt in flight,
// with its own remaining need: the next admissions count it (both
// attempts of the task may still spend their forecast), and what it
// spends is its own, not taken off what the first still needs
// (docs/budget.md#hedged-tasks).
func TestAHedgeIsInFlightToo(t *testing.T) {
	f := forecasterOf(8_000, 0, 100, 2_000, 2_000, 2_000, 2_000) // the caps fit: 8,000 to claim
	for i := range 2 {
		if v, _, _ := f.admit(i); v != admit {
			t.Fatalf("task %d: %v, want admitted", i, v)
		}
	}
	if ok, need, room := f.admitHedge(1); !ok || need != 2_000 || room != 4_000 {
		t.Fatalf("hedge of task 1 with 4,000 of 8,000 committed: %v (need %d, room %d); want admitted", ok, need, room)
	}
	if v, _, _ := f.admit(2); v != admit {
		t.Fatalf("task 2 with 6,000 of 8,000 committed (task 1's two attempts): %v, want admitted", v)
	}
	if v, _, _ := f.admit(3); v != hold {
		t.Errorf("task 3 with all 8,000 committed (task 1's hedge is 2,000 of it): %v, want held", v)
	}
	// Each attempt's spend is its own: the first of task 1 spent 1,000
	// (a grant of 400), its hedge 300 (a grant of 300); the first still
	// needs 1,000 of its 2,000, the hedge 1,700.
	f.progress(1, 1_000, 400, false)
	f.progressHedge(1, 300, 300, false)
	if got, want := f.committed(), int64(2_000+1_000+1_700+2_000); got != want {
		t.Errorf("committed %d after task 1's attempts spent 1,000 and 300, want %d", got, want)
	}
	if got, want := f.left(), int64(8_000-1_300); got != want {
		t.Errorf("left %d, want %d (both attempts' spend taken off)", got, want)
	}
}

// TestAHedgedTaskIsNotAWholeTask: a hedged task's spend is two attempts',
// so it says nothing of what one task needs: it leaves the average, as a
// short start does (docs/budget.md#hedged-tasks).
func TestAHedgedTaskIsNotAWholeTask(t *testing.T) {
	f := forecasterOf(100_000, 0, 100, 0, 0, 0, 0)
	for i := range 2 {
		if v, _, _ := f.admit(i); v != admit {
			t.Fatalf("task %d: %v, want admitted", i, v)
		}
	}
	if ok, _, _ := f.admitHedge(0); !ok {
		t.Fatal("hedge of task 0: refused")
	}
	f.ended(0, 9_000, 5_000, true) // both attempts' 9,000
	if f.answered != 0 {
		t.Errorf("after a hedged task answered: %d tasks in the average (cost %d), want none", f.answered, f.cost)
	}
	f.ended(1, 1_000, 1_200, true)
	if n, _ := f.forecast(2); n != 1_200 {
		t.Errorf("task 2's forecast %d, want the one whole task's 1,200", n)
	}
}
