package subagent_test

import (
	"context"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/subagent/llm"
)

// lateGrantLedger is the real ledger, except that a grant's reply arrives
// delay after the database made it (a slow network, a batch waiting on
// locks, an ambiguous commit settled by re-reading) and a renewal never
// answers: the database is cut off right after the grant.
type lateGrantLedger struct {
	budget.Ledger
	delay time.Duration
}

func (l lateGrantLedger) Reserve(ctx context.Context, p budget.ReserveParams) (budget.Reservation, error) {
	res, err := l.Ledger.Reserve(ctx, p)
	t := time.NewTimer(l.delay) // the reply's latency, not a synchronization
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return res, err
}

func (lateGrantLedger) Renew(ctx context.Context, _ budget.ReservationID, _ int64, _ time.Duration, _ string) (budget.Reservation, error) {
	<-ctx.Done()
	return budget.Reservation{}, ctx.Err()
}

// TestLoopTimesTheLeaseFromTheReserve: the lease started when the database
// granted it, not when the grant reached the worker. A grant that arrives
// half a lease late, followed by renewals that never answer, still has its
// call stopped before the lease ends in the database.
func TestLoopTimesTheLeaseFromTheReserve(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	sim := newSim(t, llm.SimConfig{Latency: 10 * time.Second, FinishAfter: 1})
	loop := newLoop(b, sim)
	loop.LeaseTTL = 900 * time.Millisecond
	loop.Ledger = lateGrantLedger{Ledger: b.ledger, delay: loop.LeaseTTL / 2}
	sum := loop.Run(within(t), newTask(b, "a"))
	calls := sim.Calls()
	if len(calls) != 1 || !calls[0].Cancelled {
		t.Fatalf("calls %+v (status %s, err %v): want the one call cancelled", calls, sum.Status, sum.Err)
	}
	var leaseEnd time.Time
	if err := b.pool.QueryRow(t.Context(), `SELECT lease_expires_at FROM reservation WHERE reservation_id = $1`,
		calls[0].ReservationID).Scan(&leaseEnd); err != nil {
		t.Fatal(err)
	}
	if end := calls[0].End; !end.Before(leaseEnd) {
		t.Errorf("the call ended %v after its lease ended in the database (%v; the grant arrived %v late, TTL %v)",
			end.Sub(leaseEnd), leaseEnd, loop.LeaseTTL/2, loop.LeaseTTL)
	} else {
		t.Logf("the call stopped %v before its lease ended", leaseEnd.Sub(end))
	}
}
