package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
)

// TestSweeperPostsWithinOneInterval measures auditing.md's bound "a lease
// that ran out is posted as estimated spend within one sweep interval of
// its end" (operations.md: within --lease-ttl + --sweep-interval of the
// holder's death), in database time, through budget.Sweep over the real
// ledger: 12 leases end 100 ms apart, across four sweep intervals of
// 300 ms, so some lease ends just after a pass whatever the sweeper's
// phase; each must be posted within the interval plus a margin of 500 ms
// for a loaded machine. A sweeper 4 times slower fails: some lease then
// waits at least 1.1 s.
func TestSweeperPostsWithinOneInterval(t *testing.T) {
	t.Parallel()
	const interval, margin, leases = 300 * time.Millisecond, 500 * time.Millisecond, 12
	b := setup(t)
	ra := b.openRun(t, "sweep", 10_000, 1, 10_000)
	var ids []int64
	for i := range leases {
		r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 10, Min: 1,
			Holder: "gone", TTL: time.Second + time.Duration(i)*100*time.Millisecond}))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, int64(r.ID))
	}
	ctx, cancel := context.WithCancel(b.ctx)
	var wg sync.WaitGroup
	wg.Go(func() { budget.Sweep(ctx, b.ledger, interval, nil) })
	defer func() { cancel(); wg.Wait() }()

	deadline := time.Now().Add(patience)
	for {
		var held int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM reservation WHERE reservation_id = ANY ($1) AND state = 'held'`, ids).Scan(&held); err != nil {
			t.Fatal(err)
		}
		if held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d leases still held %v after the first was due", held, leases, patience)
		}
		time.Sleep(50 * time.Millisecond) // polling the database
	}
	var worst time.Duration
	var states []string
	if err := b.pool.QueryRow(b.ctx, `SELECT max(resolved_at - lease_expires_at), array_agg(DISTINCT state)
		FROM reservation WHERE reservation_id = ANY ($1)`, ids).Scan(&worst, &states); err != nil {
		t.Fatal(err)
	}
	t.Logf("the latest of %d leases was posted %v after it ended (sweep interval %v)", leases, worst, interval)
	if len(states) != 1 || states[0] != "expired" {
		t.Errorf("reservation states %v; want every one expired", states)
	}
	if worst > interval+margin {
		t.Errorf("a lease was posted %v after it ended; want within the sweep interval %v (+%v)", worst, interval, margin)
	}
	b.checkConserved(t)
}
