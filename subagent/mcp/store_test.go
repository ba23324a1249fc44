package mcp

import (
	"context"
	"time"

	"github.com/fanout/fanout/store"
)

// The store's fleet-wide parts fit this package's seams. Package subagent
// may not import store (depguard), so cmd wires *store.Semaphore through
// an adapter like storeSemaphore (docs/mcp.md, "Wiring"); *store.RateLimiter
// is a RateLimiter as it is.
var (
	_ Semaphore   = storeSemaphore{}
	_ RateLimiter = (*store.RateLimiter)(nil)
)

// storeSemaphore adapts *store.Semaphore to Semaphore.
type storeSemaphore struct{ s *store.Semaphore }

func (a storeSemaphore) Acquire(ctx context.Context, holder string, want []SlotRequest, ttl time.Duration) (Lease, error) {
	req := make([]store.SlotRequest, len(want))
	for i, w := range want {
		req[i] = store.SlotRequest{Key: w.Key, Limit: w.Limit}
	}
	l, err := a.s.Acquire(ctx, holder, req, ttl)
	if err != nil {
		return nil, err
	}
	return &storeLease{s: a.s, l: l}, nil
}

type storeLease struct {
	s *store.Semaphore
	l store.SlotLease
}

func (l *storeLease) Hold(ctx context.Context, fn func(context.Context) error) error {
	return l.s.Hold(ctx, &l.l, fn)
}

func (l *storeLease) Release(ctx context.Context, grace time.Duration) error {
	return l.s.Release(ctx, l.l, grace)
}
