package orchestrator

import (
	"context"
	"testing"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
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
