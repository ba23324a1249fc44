package subagent_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// lateLedger is the real ledger, except that the reply of the first try of
// each reserve (by key) and of each settle (by reservation) comes delay
// after the database did it: a database slowed down by a deep group-commit
// queue and row locks on a loaded machine (issue 44).
type lateLedger struct {
	budget.Ledger
	delay time.Duration
	mu    sync.Mutex
	seen  map[string]bool
}

// late reports whether this is the first try of what.
func (l *lateLedger) late(what string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := !l.seen[what]
	l.seen[what] = true
	return first
}

// wait waits out the delay of a late reply, or until ctx ends (its error).
func (l *lateLedger) wait(ctx context.Context) error {
	t := time.NewTimer(l.delay) // the reply's latency, not a synchronization
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *lateLedger) Reserve(ctx context.Context, p budget.ReserveParams) (budget.Reservation, error) {
	res, err := l.Ledger.Reserve(ctx, p)
	if err == nil && l.late("reserve "+p.Key) {
		if err := l.wait(ctx); err != nil {
			return budget.Reservation{}, err
		}
	}
	return res, err
}

func (l *lateLedger) Settle(ctx context.Context, p budget.SettleParams) (budget.Reservation, error) {
	res, err := l.Ledger.Settle(ctx, p)
	if err == nil && l.late(fmt.Sprint("settle ", p.Reservation)) {
		if err := l.wait(ctx); err != nil {
			return budget.Reservation{}, err
		}
	}
	return res, err
}

// TestLoopWaitsOutASlowLedger: a reserve or a settle whose reply comes
// later than the bound a call has once its task ended (ledgerTry) is
// waited for while the task lives: the task succeeds with one reservation
// per call, each settled once, and the ledger is conserved.
func TestLoopWaitsOutASlowLedger(t *testing.T) {
	subagent.SetLedgerTry(t, 200*time.Millisecond)
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	sim := newSim(t, llm.SimConfig{FinishAfter: 2, Facts: 1, InputTokens: 100, OutputTokens: 50})
	loop := newLoop(b, sim)
	loop.LeaseTTL = 10 * time.Second
	loop.Ledger = &lateLedger{Ledger: b.ledger, delay: 3 * 200 * time.Millisecond, seen: map[string]bool{}}
	sum := loop.Run(within(t), newTask(b, "a"))
	if sum.Status != subagent.StatusSucceeded {
		t.Fatalf("task ended %s (%v); want it SUCCEEDED through the slow ledger", sum.Status, sum.Err)
	}
	rs := b.reservations(t)
	if len(rs) != len(sim.Calls()) {
		t.Errorf("%d reservations for %d model calls; want one each", len(rs), len(sim.Calls()))
	}
	for _, r := range rs {
		if r.State != "settled" || r.Estimated {
			t.Errorf("reservation %d (%s) is %s, estimated %v; want settled with the call's usage", r.ID, r.Key, r.State, r.Estimated)
		}
	}
	b.checkLedger(t)
}

// slowRenewLedger is the real ledger, except that the first renewal of
// each reservation is done in the database and its reply comes too late.
type slowRenewLedger struct {
	budget.Ledger
	first *lateLedger // only its record of first tries
}

func (l slowRenewLedger) Renew(ctx context.Context, id budget.ReservationID, gen int64, ttl time.Duration, secret string) (budget.Reservation, error) {
	res, err := l.Ledger.Renew(ctx, id, gen, ttl, secret)
	if err == nil && l.first.late(fmt.Sprint("renew ", id)) {
		<-ctx.Done()
		return budget.Reservation{}, ctx.Err()
	}
	return res, err
}

// TestLoopRenewsThroughASlowLedger: a lease renewal whose reply comes too
// late is tried again while the lease has time left, so the call goes on
// and the task succeeds, its call stopped by nothing.
func TestLoopRenewsThroughASlowLedger(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	loop := newLoop(b, nil)
	loop.LeaseTTL = 3 * time.Second
	// A call of a lease and a half: the first renewal (at TTL/3) runs out
	// of time at 2·TTL/3, the second must go through.
	sim := newSim(t, llm.SimConfig{Latency: loop.LeaseTTL * 3 / 2, FinishAfter: 1, Facts: 1})
	loop.Model = sim
	loop.Ledger = slowRenewLedger{Ledger: b.ledger, first: &lateLedger{seen: map[string]bool{}}}
	sum := loop.Run(within(t), newTask(b, "a"))
	if sum.Status != subagent.StatusSucceeded {
		t.Fatalf("task ended %s (%v); want it SUCCEEDED through the slow renewal", sum.Status, sum.Err)
	}
	for _, c := range sim.Calls() {
		if c.Cancelled {
			t.Errorf("call under reservation %d was cancelled", c.ReservationID)
		}
	}
	b.checkLedger(t)
}
