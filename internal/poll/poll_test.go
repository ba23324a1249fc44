package poll_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanout/fanout/internal/poll"
)

// TestWakesDuringAPollMakeOneMore: a hundred wakes while a poll runs make
// exactly one more poll, and a wake is never lost.
func TestWakesDuringAPollMakeOneMore(t *testing.T) {
	l := poll.New()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var polls atomic.Int32
	inPoll, release := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Run(ctx, time.Hour, func(context.Context) {
			if polls.Add(1) == 1 {
				close(inPoll)
				<-release
			}
		})
	}()
	l.Wake()
	select {
	case <-inPoll:
	case <-time.After(5 * time.Second):
		t.Fatal("a wake did not start a poll within 5 s")
	}
	for range 100 {
		l.Wake()
	}
	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for polls.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := polls.Load(); got != 2 {
		t.Fatalf("polls after the wakes = %d; want 2", got)
	}
	// No third poll is owed: Wake is now the only way to get one.
	l.Wake()
	deadline = time.Now().Add(5 * time.Second)
	for polls.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if got := polls.Load(); got != 3 {
		t.Errorf("polls = %d; want 3 (one per wake after the last poll)", got)
	}
}

// TestPollsEveryInterval: without wakes the loop polls on its timer.
func TestPollsEveryInterval(t *testing.T) {
	l := poll.New()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	polled := make(chan struct{}, 10)
	go l.Run(ctx, 10*time.Millisecond, func(context.Context) { polled <- struct{}{} })
	for i := range 3 {
		select {
		case <-polled:
		case <-time.After(5 * time.Second):
			t.Fatalf("poll %d did not come within 5 s of a 10 ms interval", i+1)
		}
	}
}
