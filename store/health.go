package store

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Health is what one health check of the database found: the figures the
// alerts of deploy/prometheus/fanout-rules.yaml read. Every figure is the
// whole database's, not one node's.
type Health struct {
	// Accounts is how many ledger accounts conservation_check looked at
	// (0 only on an empty ledger), and Unconserved how many of them break
	// conservation (I2): balance and journal disagree, or spend passed the
	// limit. Anything but 0 is a defect or tampering.
	Accounts, Unconserved int64
	// OverdueReservations are held reservations whose lease ended more than
	// HealthConfig.LeaseGrace ago: the sweeper should have posted them.
	OverdueReservations int64
	// StaleRuns are RUNNING runs whose owner's heartbeat is older than
	// HealthConfig.StaleAfter: no replica drives or has adopted them.
	// OldestHeartbeat is the age of the oldest heartbeat of a RUNNING run
	// (0 when none runs).
	StaleRuns       int64
	OldestHeartbeat time.Duration
	// OldestApproval is how long the oldest write still awaiting a
	// person's approval has waited (0 when none waits).
	OldestApproval time.Duration
	// NotifyQueueUsage is the fraction of PostgreSQL's notification queue
	// (8 GB) in use, pg_notification_queue_usage(): notifications some
	// listening session has not read yet. Once it is full every NOTIFY
	// fails, and with it a run's end, an exhaustion, a revocation.
	NotifyQueueUsage float64
}

// HealthConfig tunes MonitorHealth. Zero values take the documented defaults.
type HealthConfig struct {
	// Interval is how often the check runs. Default 1m. Its conservation
	// check reads the whole journal: on a large ledger, keep it long.
	Interval time.Duration
	// LeaseGrace is how long after its lease ended a held reservation
	// counts as overdue. Default 30s (the sweeper posts within one
	// --sweep-interval, 2s by default).
	LeaseGrace time.Duration
	// StaleAfter is how old a RUNNING run's heartbeat must be for the run to
	// count as stale. Default 1m: twice the default --orphan-after, by
	// when a live replica should have adopted it.
	StaleAfter time.Duration
	// Meter makes the gauges. Default otel.Meter of this package.
	Meter metric.Meter
	// Logger receives failed checks. Default slog.Default().
	Logger *slog.Logger
}

func (c HealthConfig) withDefaults() HealthConfig {
	if c.Interval <= 0 {
		c.Interval = time.Minute
	}
	if c.LeaseGrace <= 0 {
		c.LeaseGrace = 30 * time.Second
	}
	if c.StaleAfter <= 0 {
		c.StaleAfter = time.Minute
	}
	if c.Meter == nil {
		c.Meter = otel.Meter(scope)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// CheckHealth reads Health in one statement, as the role the pool logs in
// as (a node's fanout_app may read conservation_check).
func CheckHealth(ctx context.Context, pool *Pool, leaseGrace, staleAfter time.Duration) (Health, error) {
	var h Health
	var oldest, approval float64
	err := pool.QueryRow(ctx, `SELECT c.accounts, c.unconserved, r.overdue, s.stale, s.oldest, a.oldest,
		       pg_notification_queue_usage()
		FROM (SELECT count(*) AS accounts, count(*) FILTER (WHERE NOT conserved) AS unconserved
		        FROM conservation_check) c,
		     (SELECT count(*) AS overdue FROM reservation
		       WHERE state = 'held' AND lease_expires_at <= now() - make_interval(secs => $1)) r,
		     (SELECT count(*) FILTER (WHERE owner_heartbeat < now() - make_interval(secs => $2)) AS stale,
		             coalesce(extract(epoch FROM now() - min(owner_heartbeat)), 0)::float8 AS oldest
		        FROM run WHERE state = 'RUNNING') s,
		     (SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest
		        FROM tool_call WHERE state = 'awaiting_approval') a`,
		leaseGrace.Seconds(), staleAfter.Seconds()).Scan(&h.Accounts, &h.Unconserved, &h.OverdueReservations,
		&h.StaleRuns, &oldest, &approval, &h.NotifyQueueUsage)
	if err != nil {
		return Health{}, fmt.Errorf("check the database's health: %w", err)
	}
	h.OldestHeartbeat = time.Duration(oldest * float64(time.Second))
	h.OldestApproval = time.Duration(approval * float64(time.Second))
	return h, nil
}

// Names of the health metrics (their Prometheus names replace the dots with
// underscores and add _seconds or _total; see docs/telemetry.md's metrics table).
const (
	metricUnconserved     = "fanout.ledger.accounts.unconserved"
	metricOverdue         = "fanout.ledger.reservations.overdue"
	metricStaleRuns       = "fanout.runs.stale"
	metricOldestHeartbeat = "fanout.runs.heartbeat.age"
	metricOldestApproval  = "fanout.approvals.oldest.age"
	metricNotifyQueue     = "fanout.notify.queue.usage"
	metricHealthChecks    = "fanout.health.checks"
	metricLeasesExpired   = "fanout.sweeper.leases.expired"
)

// attrHealthOutcome tells a health check that read the database ("ok")
// from one that failed ("error").
const attrHealthOutcome = attribute.Key("fanout.health.outcome")

// MonitorHealth runs CheckHealth every cfg.Interval until ctx ends and
// publishes the last result as gauges (fanout.ledger.accounts.unconserved,
// fanout.ledger.reservations.overdue, fanout.runs.stale,
// fanout.runs.heartbeat.age, fanout.approvals.oldest.age,
// fanout.notify.queue.usage;
// fanout.semaphore.slots.held by key from its
// own count) and every check as fanout.health.checks by outcome. The
// gauges report nothing until a check has succeeded, so a node that cannot
// check reads as absent, not as healthy.
func MonitorHealth(ctx context.Context, pool *Pool, cfg HealthConfig) {
	cfg = cfg.withDefaults()
	var mu sync.Mutex
	var last *Health
	m := cfg.Meter
	unconserved, _ := m.Int64ObservableGauge(metricUnconserved, metric.WithUnit("{account}"),
		metric.WithDescription("Ledger accounts failing conservation_check (balance and journal disagree, or spend over the limit), in the whole database; 0 on a healthy ledger."))
	overdue, _ := m.Int64ObservableGauge(metricOverdue, metric.WithUnit("{reservation}"),
		metric.WithDescription("Held reservations whose lease ended more than the grace ago, in the whole database: the sweeper has not posted them."))
	stale, _ := m.Int64ObservableGauge(metricStaleRuns, metric.WithUnit("{run}"),
		metric.WithDescription("RUNNING runs whose owner's heartbeat is older than the stale age: no replica drives or adopted them."))
	oldest, _ := m.Float64ObservableGauge(metricOldestHeartbeat, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest heartbeat of a RUNNING run (0 when none runs)."))
	approval, _ := m.Float64ObservableGauge(metricOldestApproval, metric.WithUnit("s"),
		metric.WithDescription("How long the oldest write still awaiting a person's approval has waited, in the whole database (0 when none waits)."))
	notifyQueue, _ := m.Float64ObservableGauge(metricNotifyQueue, metric.WithUnit("1"),
		metric.WithDescription("Fraction of PostgreSQL's notification queue in use (pg_notification_queue_usage()): notifications a listening session has not read. Full, every NOTIFY fails."))
	checks, _ := m.Int64Counter(metricHealthChecks, metric.WithUnit("{check}"),
		metric.WithDescription("Database health checks this process ran, by outcome."))
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		mu.Lock()
		defer mu.Unlock()
		if last == nil {
			return nil
		}
		o.ObserveInt64(unconserved, last.Unconserved)
		o.ObserveInt64(overdue, last.OverdueReservations)
		o.ObserveInt64(stale, last.StaleRuns)
		o.ObserveFloat64(oldest, last.OldestHeartbeat.Seconds())
		o.ObserveFloat64(approval, last.OldestApproval.Seconds())
		o.ObserveFloat64(notifyQueue, last.NotifyQueueUsage)
		return nil
	}, unconserved, overdue, stale, oldest, approval, notifyQueue)
	if err != nil {
		cfg.Logger.Warn("health gauges off", "err", err)
	} else {
		defer func() { _ = reg.Unregister() }()
	}
	slots := newSlotGauge(m, cfg.Logger) // fanout.semaphore.slots.held (semaphore.go)
	defer slots.stop()
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, cfg.Interval)
		h, err := CheckHealth(cctx, pool, cfg.LeaseGrace, cfg.StaleAfter)
		if serr := slots.refresh(cctx, pool); serr != nil && ctx.Err() == nil {
			cfg.Logger.Warn("semaphore slots gauge", "err", serr)
		}
		cancel()
		switch {
		case err == nil:
			mu.Lock()
			last = &h
			mu.Unlock()
			checks.Add(ctx, 1, metric.WithAttributes(attrHealthOutcome.String("ok")))
			if h.Unconserved > 0 {
				cfg.Logger.Error("ledger accounts fail conservation_check", "accounts", h.Unconserved)
			}
		case ctx.Err() == nil:
			checks.Add(ctx, 1, metric.WithAttributes(attrHealthOutcome.String("error")))
			cfg.Logger.Warn("database health check", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

var (
	sweptOnce sync.Once
	swept     metric.Int64Counter
)

// CountExpiredLeases adds n to fanout.sweeper.leases.expired: reservations
// whose lease ran out that the sweeper posted as estimated spend
// (budget.SweepConfig.Expired).
func CountExpiredLeases(ctx context.Context, n int) {
	sweptOnce.Do(func() {
		swept, _ = otel.Meter(scope).Int64Counter(metricLeasesExpired, metric.WithUnit("{reservation}"),
			metric.WithDescription("Reservations whose lease ran out that the sweeper posted as estimated spend "+
				"(their tokens are in fanout.budget.tokens.spent with estimated=true)."))
	})
	if n > 0 {
		swept.Add(context.WithoutCancel(ctx), int64(n))
	}
}
