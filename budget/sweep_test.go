package budget_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
)

// expiring is a ledger whose ExpireLeases resolves the batches it is given,
// one per call, then nothing.
type expiring struct {
	budget.Ledger
	mu      sync.Mutex
	batches []int
}

func (l *expiring) ExpireLeases(context.Context) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.batches) == 0 {
		return 0, nil
	}
	n := l.batches[0]
	l.batches = l.batches[1:]
	return n, nil
}

// TestSweepCountsExpiredLeases: the sweeper tells ExpiredFunc every
// reservation it posted (fanout.sweeper.leases.expired), a full batch and
// the rest in the same pass.
func TestSweepCountsExpiredLeases(t *testing.T) {
	t.Parallel()
	l := &expiring{batches: []int{500, 3}}
	counted := make(chan int, 10)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() {
		budget.SweepWithConfig(ctx, l, budget.SweepConfig{Interval: 10 * time.Millisecond,
			ExpiredFunc: func(_ context.Context, n int) { counted <- n }})
	})
	defer func() { cancel(); wg.Wait() }()
	total := 0
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	for total < 503 {
		select {
		case n := <-counted:
			total += n
		case <-timer.C:
			t.Fatalf("the sweeper counted %d expired leases, want 503", total)
		}
	}
	if total != 503 {
		t.Fatalf("the sweeper counted %d expired leases, want 503", total)
	}
}
