package budget

import (
	"context"
	"log/slog"
	"time"
)

// SweepConfig configures SweepWithConfig.
type SweepConfig struct {
	// Interval is how often the sweeper looks for expired leases. Required.
	Interval time.Duration
	// Logger receives the sweeper's logs. Default slog.Default().
	Logger *slog.Logger
	// ExpiredFunc, when set, is told how many reservations each pass posted
	// as estimated spend (cmd counts them as fanout.sweeper.leases.expired).
	ExpiredFunc func(ctx context.Context, n int)
}

// Sweep calls l.ExpireLeases every interval until ctx ends, so that a
// reservation whose holder vanished is posted as estimated spend within its
// lease plus one interval. Every node may run it: expiring is idempotent.
func Sweep(ctx context.Context, l Ledger, interval time.Duration, logger *slog.Logger) {
	SweepWithConfig(ctx, l, SweepConfig{Interval: interval, Logger: logger})
}

// SweepWithConfig is Sweep with cfg.
func SweepWithConfig(ctx context.Context, l Ledger, cfg SweepConfig) {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for {
			n, err := l.ExpireLeases(ctx)
			if n > 0 && cfg.ExpiredFunc != nil {
				cfg.ExpiredFunc(ctx, n) // a pass that failed part way still posted n
			}
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
