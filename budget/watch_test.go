package budget_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
)

// source is an in-memory WatchSource: notices are pushed on a channel, the
// poll answers from a map, and Listen can be made to drop.
type source struct {
	mu      sync.Mutex
	ended   map[string]budget.RunSignal
	notices chan budget.RunSignal
	listens chan struct{} // receives each time Listen is (re)entered
	drop    chan struct{} // a send makes the current Listen fail
}

func newSource() *source {
	return &source{
		ended:   map[string]budget.RunSignal{},
		notices: make(chan budget.RunSignal, 16),
		listens: make(chan struct{}, 16),
		drop:    make(chan struct{}),
	}
}

func (s *source) Listen(ctx context.Context, ready func(), deliver func(budget.RunSignal)) error {
	s.listens <- struct{}{}
	ready()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.drop:
			return errors.New("connection reset")
		case n := <-s.notices:
			deliver(n)
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
	go func() { defer close(done); w.Run(ctx) }() //nolint:errcheck
	t.Cleanup(func() { cancel(); <-done })
	<-src.listens
	return w
}

func waitDone(t *testing.T, s *budget.Subscription) budget.RunSignal {
	t.Helper()
	select {
	case <-s.Done():
		return s.Signal()
	case <-time.After(5 * time.Second):
		t.Fatal("no signal")
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
	src.notices <- budget.RunSignal{RunID: "r1", State: budget.StateExhausted}
	src.notices <- budget.RunSignal{RunID: "r1", State: budget.StateClosed} // later news does not replace the first
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
	w := start(t, src, budget.WatcherConfig{PollInterval: time.Hour, MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond})
	s := w.Subscribe("r1")
	defer s.Close()
	src.drop <- struct{}{}
	// The run ends while the listener is away: the poll on reconnect finds it.
	src.end(budget.RunSignal{RunID: "r1", State: budget.StateExhausted})
	select {
	case <-src.listens:
	case <-time.After(5 * time.Second):
		t.Fatal("listener did not reconnect")
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
	src.notices <- budget.RunSignal{RunID: "r1", State: budget.StateCancelled}
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
