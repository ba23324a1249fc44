package orchestrator

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// TestPublishedEndNeedsNoRead: the events the run's end hands to this
// node's followers (publish) join the tail their streams read, so that a
// stream at the end sends them without a read of the store, and knows
// there is nothing more to read until the next move. Events that do not
// follow the tail (a gap: another writer's events not read yet) are only
// a wake: the next shared read finds them.
func TestPublishedEndNeedsNoRead(t *testing.T) {
	ev := func(seq int64) *fanoutv1.RunEvent { return &fanoutv1.RunEvent{RunId: "r", Sequence: seq} }
	f := newFollowers(nil, time.Hour, func(error) {})
	f.follow("r")
	defer f.unfollow("r")
	reads := 0
	log := []*fanoutv1.RunEvent{ev(1), ev(2), ev(3)}
	own := func(after int64) ([]*fanoutv1.RunEvent, error) {
		reads++
		var out []*fanoutv1.RunEvent
		for _, e := range log {
			if e.GetSequence() > after {
				out = append(out, e)
			}
		}
		return out, nil
	}
	ctx := context.Background()
	seqs := func(evs []*fanoutv1.RunEvent) (s []int64) {
		for _, e := range evs {
			s = append(s, e.GetSequence())
		}
		return s
	}

	// A stream reads the log to its end, then finds nothing more.
	if got, err := f.events(ctx, "r", 0, 3, watchPage, own); err != nil || len(got) != 3 {
		t.Fatalf("first read: %v, %v; want events 1..3", seqs(got), err)
	}
	if got, err := f.events(ctx, "r", 3, 3, watchPage, own); err != nil || len(got) != 0 || reads != 1 {
		t.Fatalf("at the end: %v, %v after %d reads; want nothing, after one read", seqs(got), err, reads)
	}

	// The end appends 4 and 5 and hands them over.
	_, changed := f.state("r")
	log = append(log, ev(4), ev(5))
	f.publish("r", []*fanoutv1.RunEvent{ev(4), ev(5)})
	select {
	case <-changed:
	default:
		t.Fatal("publish did not wake the run's streams")
	}
	got, err := f.events(ctx, "r", 3, 3, watchPage, own)
	if err != nil || len(got) != 2 || got[0].GetSequence() != 4 || got[1].GetSequence() != 5 {
		t.Fatalf("after publish: %v, %v; want events 4, 5", seqs(got), err)
	}
	if got, err := f.events(ctx, "r", 5, 5, watchPage, own); err != nil || len(got) != 0 {
		t.Fatalf("after the published events: %v, %v; want nothing", seqs(got), err)
	}
	if reads != 1 {
		t.Errorf("%d reads of the store, want 1: the published events were read back", reads)
	}

	// A gap: 6 is another writer's, not read yet; 7 is only a wake.
	log = append(log, ev(6), ev(7))
	f.publish("r", []*fanoutv1.RunEvent{ev(7)})
	got, err = f.events(ctx, "r", 5, 5, watchPage, own)
	if err != nil || len(got) != 2 || got[0].GetSequence() != 6 || got[1].GetSequence() != 7 || reads != 2 {
		t.Errorf("after a gap: %v, %v after %d reads; want 6, 7 from a second read", seqs(got), err, reads)
	}
}

// TestNoticesWakeStreamsWhateverOthersRead: a notice of a run's new head
// wakes the streams waiting at the end of what they read, whatever another
// stream of the run read meanwhile. A stream asking for more than the run
// has (after_sequence past its end) reads nothing, which says nothing of
// what follows the others' tail: it must not make the node take a later
// notice as read already. And a stream that reads events the waiting ones
// have not been woken for (it knew of a later head) wakes them, since the
// notices of those events will be taken as read.
func TestNoticesWakeStreamsWhateverOthersRead(t *testing.T) {
	ev := func(seq int64) *fanoutv1.RunEvent { return &fanoutv1.RunEvent{RunId: "r", Sequence: seq} }
	f := newFollowers(nil, time.Hour, func(error) {})
	f.follow("r")
	defer f.unfollow("r")
	log := []*fanoutv1.RunEvent{ev(1), ev(2), ev(3)}
	own := func(after int64) ([]*fanoutv1.RunEvent, error) {
		var out []*fanoutv1.RunEvent
		for _, e := range log {
			if e.GetSequence() > after {
				out = append(out, e)
			}
		}
		return out, nil
	}
	ctx := context.Background()
	woken := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}

	// Stream A reads 1..3 and waits at the end.
	if got, err := f.events(ctx, "r", 0, 3, watchPage, own); err != nil || len(got) != 3 {
		t.Fatalf("A's first read: %d events, %v; want 3", len(got), err)
	}
	_, changedA := f.state("r")
	if got, err := f.events(ctx, "r", 3, 3, watchPage, own); err != nil || len(got) != 0 {
		t.Fatalf("A at the end: %d events, %v; want none", len(got), err)
	}
	// Stream B asks for what follows sequence 1e9: there is nothing.
	if got, err := f.events(ctx, "r", 1_000_000_000, 3, watchPage, own); err != nil || len(got) != 0 {
		t.Fatalf("B past the end: %d events, %v; want none", len(got), err)
	}
	// Another node appends 4, and its notice arrives.
	log = append(log, ev(4))
	f.moved("r", 4)
	if !woken(changedA) {
		t.Fatal("the notice of head 4 did not wake stream A after stream B asked for events past 1e9")
	}
	if got, err := f.events(ctx, "r", 3, 4, watchPage, own); err != nil || len(got) != 1 || got[0].GetSequence() != 4 {
		t.Fatalf("A after the notice: %d events, %v; want event 4", len(got), err)
	}

	// A waits at 4. Another node appends 5; before its notice arrives, a
	// new stream C that knows of head 5 reads it.
	_, changedA = f.state("r")
	if got, err := f.events(ctx, "r", 4, 4, watchPage, own); err != nil || len(got) != 0 {
		t.Fatalf("A at the end: %d events, %v; want none", len(got), err)
	}
	log = append(log, ev(5))
	if got, err := f.events(ctx, "r", 4, 5, watchPage, own); err != nil || len(got) != 1 || got[0].GetSequence() != 5 {
		t.Fatalf("C: %d events, %v; want event 5", len(got), err)
	}
	f.moved("r", 5)
	if !woken(changedA) {
		t.Fatal("stream A, waiting at 4, was not woken for event 5: stream C read it first and the notice was taken as read")
	}
}

// failingHeads is an EventReader whose Heads fails until ok is closed.
type failingHeads struct {
	EventReader
	ok    chan struct{}
	tries atomic.Int64
}

func (h *failingHeads) Heads(context.Context, []string) (map[string]runs.Head, error) {
	h.tries.Add(1)
	select {
	case <-h.ok:
		return map[string]runs.Head{"r": {Sequence: 7, State: fanoutv1.RunState_RUN_STATE_RUNNING}}, nil
	default:
		return nil, errors.New("the database is restarting")
	}
}

// TestResyncRetriedSoon: a re-read of the heads when the LISTEN connection
// is back (resync) that fails, as it often does just after the database
// restarted, is tried again within a fraction of a second, not at the next
// fallback poll (an hour here).
func TestResyncRetriedSoon(t *testing.T) {
	heads := &failingHeads{ok: make(chan struct{})}
	f := newFollowers(heads, time.Hour, func(error) {})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go f.poll(ctx)
	f.follow("r")
	defer f.unfollow("r")
	_, changed := f.state("r")
	f.resync()
	deadline := time.Now().Add(5 * time.Second)
	for heads.tries.Load() < 2 { // the resync's read failed, and one more
		if time.Now().After(deadline) {
			t.Fatalf("%d reads of the heads in 5s after a failed resync; want it tried again soon", heads.tries.Load())
		}
		time.Sleep(5 * time.Millisecond) // polling a counter
	}
	close(heads.ok)
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("the run's streams were not woken within 5s of the database answering again")
	}
}
