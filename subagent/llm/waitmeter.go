package llm

import (
	"context"
	"sync/atomic"
	"time"
)

// WaitMeter adds up the time the model calls made under a context spent
// queued rather than served: for a slot of the worker's model calls, in
// the fleet's rate limiter, and in the backoff after a provider's 429. The
// orchestrator sizes a run's concurrency from the time a call holds its
// task (Little's law), and waiting in our own limiter is not that: counted,
// a limiter that is full would make every task look slower and the
// concurrency grow to meet it (docs/operations.md#concurrency-from-the-rate-limits).
// Safe for concurrent use.
type WaitMeter struct{ nanos atomic.Int64 }

// Waited returns the time queued so far.
func (m *WaitMeter) Waited() time.Duration { return time.Duration(m.nanos.Load()) }

type waitMeterKey struct{}

// WithWaitMeter returns ctx carrying m: the calls made under it add their
// queued time to m.
func WithWaitMeter(ctx context.Context, m *WaitMeter) context.Context {
	return context.WithValue(ctx, waitMeterKey{}, m)
}

// addWait adds d to the meter ctx carries, if any.
func addWait(ctx context.Context, d time.Duration) {
	if m, ok := ctx.Value(waitMeterKey{}).(*WaitMeter); ok && d > 0 {
		m.nanos.Add(int64(d))
	}
}
