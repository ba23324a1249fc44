package budget

import (
	"context"
	"log/slog"
	"time"
)

// Sweep calls l.ExpireLeases every interval until ctx ends, so that a
// reservation whose holder vanished is posted as estimated spend within its
// lease plus one interval. Every node may run it: expiring is idempotent.
func Sweep(ctx context.Context, l Ledger, interval time.Duration, logger *slog.Logger) {
	if logger == nil {
		logger = slog.Default()
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for {
			n, err := l.ExpireLeases(ctx)
			if err != nil {
				if ctx.Err() == nil {
					logger.Warn("budget sweeper: expire leases", "err", err)
				}
				break
			}
			if n > 0 {
				logger.Info("budget sweeper: expired leases posted as estimated spend", "reservations", n)
			}
			if n < expireBatchHint {
				break
			}
		}
	}
}

// expireBatchHint: a sweep that resolved this many goes round again at once.
const expireBatchHint = 500
