package node

import (
	"testing"
	"time"
)

// TestABurstIsBounded (issue 44): the calls presenting one credential
// share one share of a preauth budget while its key is looked up, but at
// most burstSize of them (receive limit / waitingCallBytes: what the
// share's bytes cover of calls holding only their stream's window and their
// headers), all with the
// deadline of the first; the next call of the same credential needs a share
// of its own, so a flood with one made-up id holds at most a share's worth.
// The share is given back when the last call of the burst leaves.
func TestABurstIsBounded(t *testing.T) {
	t.Parallel()
	const recvLimit = 8<<20 + 1024
	p := newPreauth(recvLimit, recvLimit, 10*time.Second, "unauthenticated") // one share
	if p.burstSize != 64 {
		t.Fatalf("burst size at a receive limit of %d: %d; want 64", recvLimit, p.burstSize)
	}
	var releases []func()
	var first time.Time
	for i := range p.burstSize {
		release, deadline, ok := p.tryJoin("fk_a:secret")
		if !ok {
			t.Fatalf("call %d of a burst of one credential refused; want %d admitted on one share", i, p.burstSize)
		}
		if i == 0 {
			first = deadline
		}
		if !deadline.Equal(first) {
			t.Errorf("call %d's deadline %s; want the first call's, %s", i, deadline, first)
		}
		releases = append(releases, release)
	}
	if _, _, ok := p.tryJoin("fk_a:secret"); ok {
		t.Errorf("call %d of one credential admitted on a budget of one share; want refused", p.burstSize+1)
	}
	if _, _, ok := p.tryJoin("fk_b:secret"); ok {
		t.Error("another credential admitted while the burst holds the only share")
	}
	for _, release := range releases[1:] {
		release()
	}
	releases[1]() // twice: nothing more
	if _, _, ok := p.tryJoin("fk_b:secret"); ok {
		t.Error("another credential admitted while the burst's first call still holds the share")
	}
	releases[0]()
	release, _, ok := p.tryJoin("fk_b:secret")
	if !ok {
		t.Fatal("another credential refused once the burst left; want the share free")
	}
	release()
}
