package budget_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
)

// patience bounds every wait in these tests: a wait that has not ended by
// then fails, saying what did not happen, instead of hanging until the
// package timeout.
const patience = 10 * time.Second

// source is an in-memory WatchSource: notices are pushed on a channel, the
// poll answers from a map, and Listen can be made to drop.
type source struct {
	mu        sync.Mutex
	ended     map[string]budget.RunSignal
	notices   chan budget.RunSignal
	delivered chan budget.RunSignal // receives each notice once the watcher's deliver returned
	listens   chan struct{}         // receives each time Listen is (re)entered
	drop      chan func()           // a send makes the current Listen run it as if disconnected, then reconnect
}

func newSource() *source {
	return &source{
		ended:     map[string]budget.RunSignal{},
		notices:   make(chan budget.RunSignal, 16),
		delivered: make(chan budget.RunSignal, 16),
		listens:   make(chan struct{}, 16),
		drop:      make(chan func()),
	}
}

func (s *source) Listen(ctx context.Context, ready func(), deliver func(budget.RunSignal)) error {
	s.listens <- struct{}{}
	ready()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case f := <-s.drop:
			// The connection is lost and back: what was sent meanwhile
			// (f) is gone, and the source says it listens again.
			f()
			s.listens <- struct{}{}
			ready()
		case n := <-s.notices:
			deliver(n)
			select {
			case s.delivered <- n:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

func (s *source) EndedRuns(_ context.Context, ids []string) ([]budget.RunSignal, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []budget.RunSignal
	for _, id := range ids {
		if sig, ok := s.ended[id]; ok {
			out = append(out, sig)
		}
	}
	return out, nil
}

// notify ends sig's run in the source, as the ledger's transaction does,
// then sends sig's notice, as its commit does, and waits until the watcher
// has handled it: woken its poll, which reads and delivers on its own
// goroutine (the tests wait on the subscriptions for that).
func (s *source) notify(t *testing.T, sig budget.RunSignal) {
	t.Helper()
	s.end(sig)
	s.notices <- sig
	select {
	case <-s.delivered:
	case <-time.After(patience):
		t.Fatalf("the watcher did not handle the notice %+v within %v", sig, patience)
	}
}

func (s *source) end(sig budget.RunSignal) {
	s.mu.Lock()
	s.ended[sig.RunID] = sig
	s.mu.Unlock()
}

func start(t *testing.T, src *source, cfg budget.WatcherConfig) *budget.Watcher {
	t.Helper()
	w := budget.NewWatcher(src, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }() //nolint:errcheck // returns ctx.Err() when the test ends it
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(patience):
			t.Errorf("the watcher's Run did not return within %v of its context ending", patience)
		}
	})
	select {
	case <-src.listens:
	case <-time.After(patience):
		t.Fatalf("the watcher did not start listening within %v", patience)
	}
	return w
}

// waitCancelled waits until s is told that its run was cancelled or closed.
func waitCancelled(t *testing.T, s *budget.Subscription) {
	t.Helper()
	select {
	case <-s.Cancelled():
	case <-time.After(patience):
		t.Fatalf("no cancel within %v", patience)
	}
}

func waitDone(t *testing.T, s *budget.Subscription) budget.RunSignal {
	t.Helper()
	select {
	case <-s.Done():
		return s.Signal()
	case <-time.After(patience):
		t.Fatalf("no signal within %v", patience)
		return budget.RunSignal{}
	}
}

func TestNoticeReachesEverySubscriberOnce(t *testing.T) {
	src := newSource()
	w := start(t, src, budget.WatcherConfig{PollInterval: time.Hour})
	a, b := w.Subscribe("r1"), w.Subscribe("r1")
	other := w.Subscribe("r2")
	defer a.Close()
	defer b.Close()
	defer other.Close()
	src.notify(t, budget.RunSignal{RunID: "r1", State: budget.StateExhausted})
	waitDone(t, a)                                                          // the notice woke the poll, which delivered it
	src.notify(t, budget.RunSignal{RunID: "r1", State: budget.StateClosed}) // the first news stays the first
	if sig := waitDone(t, a); sig.State != budget.StateExhausted || !errors.Is(sig.Err(), budget.ErrExhausted) {
		t.Errorf("a got %+v", sig)
	}
	if sig := waitDone(t, b); sig.State != budget.StateExhausted {
		t.Errorf("b got %+v", sig)
	}
	select {
	case <-other.Done():
		t.Error("a notice for r1 ended r2")
	default:
	}
}

// TestLaterNewsDoesNotReplaceTheFirst: once the watcher has heard that a
// run ended, later news of it (another notice, a poll that finds it in
// another state) does not replace that: Signal stays the first news, and a
// cancel after exhaustion is told apart, on Cancelled. Every subscriber is
// told the first news, at once, also one that subscribes after all of it:
// a subscriber that came first cannot show this, since it is fired only
// once whatever the watcher keeps.
func TestLaterNewsDoesNotReplaceTheFirst(t *testing.T) {
	src := newSource()
	w := start(t, src, budget.WatcherConfig{PollInterval: time.Hour})
	early := w.Subscribe("r1") // while r1 is watched, the watcher keeps what it heard of it
	defer early.Close()
	src.notify(t, budget.RunSignal{RunID: "r1", State: budget.StateExhausted, Cause: "budget exhausted"})
	waitDone(t, early)
	src.notify(t, budget.RunSignal{RunID: "r1", State: budget.StateCancelled, Cause: "caller cancelled"})
	waitCancelled(t, early)

	toldFirst := func(who string, s *budget.Subscription) {
		t.Helper()
		select {
		case <-s.Done():
		default:
			t.Fatalf("%s: Done is not closed, though the watcher has heard that the run ended", who)
		}
		if sig := s.Signal(); sig.RunID != "r1" || sig.State != budget.StateExhausted || sig.Cause != "budget exhausted" ||
			!errors.Is(sig.Err(), budget.ErrExhausted) {
			t.Errorf("%s was told %+v (err %v); want the first news, r1 exhausted", who, sig, sig.Err())
		}
	}
	toldFirst("the subscriber from before the notices", early)
	late := w.Subscribe("r1")
	defer late.Close()
	toldFirst("a subscriber after both notices", late)
	toldCancel(t, "a subscriber after both notices", late, "caller cancelled")

	// A poll that finds the run in yet another state changes nothing either.
	src.end(budget.RunSignal{RunID: "r1", State: budget.StateClosed, Cause: "closed"})
	if err := w.Poll(t.Context()); err != nil {
		t.Fatal(err)
	}
	later := w.Subscribe("r1")
	defer later.Close()
	toldFirst("a subscriber after a poll found the run closed", later)
	toldFirst("the subscriber from before the notices, after it all", early)
	toldCancel(t, "a subscriber after a poll found the run closed", later, "caller cancelled")
	toldCancel(t, "the subscriber from before the notices, after it all", early, "caller cancelled")
}

// toldCancel checks that s was told, at once, that its run was cancelled
// with cause.
func toldCancel(t *testing.T, who string, s *budget.Subscription, cause string) {
	t.Helper()
	select {
	case <-s.Cancelled():
	default:
		t.Fatalf("%s: Cancelled is not closed, though the watcher has heard that the run was cancelled", who)
	}
	if sig := s.CancelSignal(); sig.State != budget.StateCancelled || sig.Cause != cause || !errors.Is(sig.Err(), budget.ErrRunCancelled) {
		t.Errorf("%s was told of the cancel %+v; want cancelled (%q)", who, sig, cause)
	}
}

// notCancelled checks that s has not been told of a cancel.
func notCancelled(t *testing.T, who string, s *budget.Subscription) {
	t.Helper()
	select {
	case <-s.Cancelled():
		t.Errorf("%s: told the run was cancelled (%+v) though it is only exhausted", who, s.CancelSignal())
	default:
	}
}

// TestCancelAfterExhaustionIsHeard: an exhausted run (whose calls DRAIN
// lets finish) that is then cancelled is news: every subscriber hears the
// exhaustion on Done and, later, the cancel with its cause on Cancelled.
// Exhaustion heard again is not news, and neither is a second cancel.
func TestCancelAfterExhaustionIsHeard(t *testing.T) {
	src := newSource()
	w := start(t, src, budget.WatcherConfig{PollInterval: time.Hour})
	s := w.Subscribe("r1")
	defer s.Close()
	src.notify(t, budget.RunSignal{RunID: "r1", State: budget.StateExhausted, Cause: "budget exhausted"})
	waitDone(t, s)
	src.notify(t, budget.RunSignal{RunID: "r1", State: budget.StateExhausted, Cause: "exhausted again"})
	if sig := waitDone(t, s); sig.State != budget.StateExhausted || sig.Cause != "budget exhausted" {
		t.Fatalf("first signal %+v, want the first exhaustion", sig)
	}
	notCancelled(t, "the subscriber", s)
	exhausted := w.Subscribe("r1")
	defer exhausted.Close()
	notCancelled(t, "a subscriber after the exhaustion", exhausted)

	src.notify(t, budget.RunSignal{RunID: "r1", State: budget.StateCancelled, Cause: "cancelled by caller: stop"})
	waitCancelled(t, s)
	src.notify(t, budget.RunSignal{RunID: "r1", State: budget.StateCancelled, Cause: "again"})
	for who, sub := range map[string]*budget.Subscription{"the subscriber": s, "a subscriber after the exhaustion": exhausted} {
		toldCancel(t, who, sub, "cancelled by caller: stop")
		if sig := sub.Signal(); sig.State != budget.StateExhausted {
			t.Errorf("%s: the first signal became %+v", who, sig)
		}
	}
	late := w.Subscribe("r1")
	defer late.Close()
	if sig := waitDone(t, late); sig.State != budget.StateExhausted {
		t.Errorf("a subscriber after the cancel: first signal %+v, want exhausted", sig)
	}
	toldCancel(t, "a subscriber after the cancel", late, "cancelled by caller: stop")
}

// TestPollHearsCancelAfterExhaustion: the poll keeps looking at a run it
// found exhausted, and finds the cancel that followed (whose notice was
// lost), with its cause.
func TestPollHearsCancelAfterExhaustion(t *testing.T) {
	src := newSource()
	w := start(t, src, budget.WatcherConfig{PollInterval: 20 * time.Millisecond})
	s := w.Subscribe("r1")
	defer s.Close()
	src.end(budget.RunSignal{RunID: "r1", State: budget.StateExhausted, Cause: "budget exhausted"}) // no notice sent
	if sig := waitDone(t, s); sig.State != budget.StateExhausted {
		t.Fatalf("first signal %+v, want exhausted", sig)
	}
	notCancelled(t, "the subscriber", s)
	src.end(budget.RunSignal{RunID: "r1", State: budget.StateCancelled, Cause: "cancelled by caller: stop"})
	select {
	case <-s.Cancelled():
	case <-time.After(patience):
		t.Fatalf("the poll did not find the cancel after the exhaustion within %v", patience)
	}
	toldCancel(t, "the subscriber", s, "cancelled by caller: stop")
}

func TestPollCoversALostNotice(t *testing.T) {
	src := newSource()
	w := start(t, src, budget.WatcherConfig{PollInterval: 20 * time.Millisecond})
	s := w.Subscribe("r1")
	defer s.Close()
	src.end(budget.RunSignal{RunID: "r1", State: budget.StateCancelled, Cause: "user"}) // no notice sent
	if sig := waitDone(t, s); sig.State != budget.StateCancelled || !errors.Is(sig.Err(), budget.ErrRunCancelled) {
		t.Errorf("got %+v", sig)
	}
}

func TestListenerReconnectsAndLooksAgain(t *testing.T) {
	src := newSource()
	w := start(t, src, budget.WatcherConfig{PollInterval: time.Hour})
	s := w.Subscribe("r1")
	defer s.Close()
	// The run ends while the listener is away (its notice is lost): the poll
	// on reconnect finds it.
	select {
	case src.drop <- func() { src.end(budget.RunSignal{RunID: "r1", State: budget.StateExhausted}) }:
	case <-time.After(patience):
		t.Fatalf("the listener could not be dropped within %v: it is not listening", patience)
	}
	select {
	case <-src.listens:
	case <-time.After(patience):
		t.Fatalf("the listener did not reconnect within %v", patience)
	}
	if sig := waitDone(t, s); sig.State != budget.StateExhausted {
		t.Errorf("got %+v", sig)
	}
}

func TestLateSubscriberIsToldAtOnce(t *testing.T) {
	src := newSource()
	w := start(t, src, budget.WatcherConfig{PollInterval: time.Hour})
	first := w.Subscribe("r1")
	defer first.Close()
	src.notify(t, budget.RunSignal{RunID: "r1", State: budget.StateCancelled})
	waitDone(t, first)
	late := w.Subscribe("r1")
	defer late.Close()
	select {
	case <-late.Done():
	default:
		t.Fatal("late subscriber not told")
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		p     budget.ReserveParams
		field string
	}{
		{budget.ReserveParams{Account: 0, RunID: "r", TenantID: "t", Attempt: 1, Want: 1, Min: 1, Holder: "n", TTL: time.Second}, "account"},
		{budget.ReserveParams{Account: 1, TenantID: "t", Attempt: 1, Want: 1, Min: 1, Holder: "n", TTL: time.Second}, "run_id"},
		{budget.ReserveParams{Account: 1, RunID: "r", Attempt: 1, Want: 1, Min: 1, Holder: "n", TTL: time.Second}, "tenant_id"},
		{budget.ReserveParams{Account: 1, RunID: "r", TenantID: "t", Want: 1, Min: 1, Holder: "n", TTL: time.Second}, "attempt"},
		{budget.ReserveParams{Account: 1, RunID: "r", TenantID: "t", Attempt: 1, Want: 0, Min: 1, Holder: "n", TTL: time.Second}, "want"},
		{budget.ReserveParams{Account: 1, RunID: "r", TenantID: "t", Attempt: 1, Want: 5, Min: 0, Holder: "n", TTL: time.Second}, "min"},
		{budget.ReserveParams{Account: 1, RunID: "r", TenantID: "t", Attempt: 1, Want: 5, Min: 6, Holder: "n", TTL: time.Second}, "min"},
		{budget.ReserveParams{Account: 1, RunID: "r", TenantID: "t", Attempt: 1, Want: 5, Min: 1, TTL: time.Second}, "holder"},
		{budget.ReserveParams{Account: 1, RunID: "r", TenantID: "t", Attempt: 1, Want: 5, Min: 1, Holder: "n"}, "ttl"},
	}
	for _, tc := range cases {
		var ve *budget.ValidationError
		if err := tc.p.Validate(); !errors.As(err, &ve) || ve.Field != tc.field || !errors.Is(err, budget.ErrInvalid) {
			t.Errorf("%+v: err = %v, want a ValidationError on %q", tc.p, err, tc.field)
		}
	}
}

// TestReopenedRunIsNewsAgain (docs/budget.md#continue): a run that ended
// (exhausted, then closed) and that a continuation reopened is not ended
// for a subscriber that comes after the reopening, while a subscriber of
// the first end still open keeps what it was told; the ledger's 'open'
// notice does it on every node. The reopened run's next end is news again.
func TestReopenedRunIsNewsAgain(t *testing.T) {
	src := newSource()
	w := start(t, src, budget.WatcherConfig{PollInterval: time.Hour})
	old := w.Subscribe("r1")
	defer old.Close()
	src.notify(t, budget.RunSignal{RunID: "r1", State: budget.StateExhausted})
	waitDone(t, old)
	src.notify(t, budget.RunSignal{RunID: "r1", State: budget.StateClosed})
	waitCancelled(t, old)
	// Reopened: the account is open again, and its notice says so.
	src.mu.Lock()
	delete(src.ended, "r1")
	src.mu.Unlock()
	src.notices <- budget.RunSignal{RunID: "r1", State: budget.StateOpen}
	select {
	case <-src.delivered:
	case <-time.After(patience):
		t.Fatal("the watcher did not handle the reopen notice")
	}
	fresh := w.Subscribe("r1")
	defer fresh.Close()
	select {
	case <-fresh.Done():
		t.Fatalf("a subscription after the reopening was told %+v of the end before it", fresh.Signal())
	default:
	}
	if sig := old.CancelSignal(); sig.State != budget.StateClosed {
		t.Errorf("the first end's subscriber now says %+v; want it keep the close it was told", sig)
	}
	src.notify(t, budget.RunSignal{RunID: "r1", State: budget.StateExhausted})
	if sig := waitDone(t, fresh); sig.State != budget.StateExhausted {
		t.Errorf("the reopened run's exhaustion reached the new subscriber as %+v", sig)
	}
}
