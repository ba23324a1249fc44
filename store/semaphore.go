package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ErrSlotLost is the cause of a Hold's cancel, and Renew's error, when a
// slot lease ended (it expired, perhaps taken by another holder) before it
// could be renewed.
var ErrSlotLost = errors.New("semaphore slot lease lost")

// Bounds of a slot request, checked here and by the database
// (migrations/functions/semaphore_*.sql).
const (
	// MaxSlotLimit is the largest limit a key may have.
	MaxSlotLimit = 10000
	// MaxSlotKeys is how many keys one acquire may take together.
	MaxSlotKeys = 16
	// MaxSlotTTL bounds a lease's TTL and a release's grace.
	MaxSlotTTL = time.Hour

	maxSlotKeyBytes = 256
	maxHolderBytes  = 256
)

// SlotRequest asks for one slot of Key, whose bound is Limit (1 to
// MaxSlotLimit). The limit is the caller's at each acquire, as
// RateLimiter.Define's limits are: lowered, it grants nothing of the key
// while as many slots as it allows are held, counting holders granted
// under the higher limit until they release or expire.
type SlotRequest struct {
	Key   string
	Limit int
}

// SlotLease is a held set of slots, one per requested key, taken together.
// Its ID is made up by the node (random), so that a retried acquire finds
// its own grant.
type SlotLease struct {
	ID     int64
	Holder string
	Keys   []string
	TTL    time.Duration
	// Asked is when the acquiring (or last renewing) statement was sent on
	// this node's monotonic clock: the lease is timed from it. The
	// database started the lease later than that (its now()), so the
	// lease ends no earlier than Asked + TTL; the two clocks are never
	// compared.
	Asked time.Time
}

// SemaphoreConfig tunes a Semaphore.
type SemaphoreConfig struct {
	Logger  *slog.Logger  // default slog.Default()
	PollMin time.Duration // first wait of a waiter, jittered; default 10ms
	PollMax time.Duration // cap of a waiter's backoff; default 500ms
}

// Semaphore is a fleet-wide counting semaphore: one row per slot of each
// key in Postgres (semaphore_slot; migrations/functions/semaphore_acquire.sql), held under a lease
// timed by the database's clock. Every node that shares the database shares
// the bound, so N workers together keep one max_in_flight. A holder that
// dies frees its slots when their lease runs out: a slot whose lease ended
// is free to the next acquire, with no sweeper.
//
// Calls are retried after a transient database error (retry.go): acquire by
// its lease id (a retry whose earlier try committed finds that grant and
// renews it), renew and release because doing them twice changes nothing
// more. An acquire cut off by the caller's context while its statement was
// in flight is released at once, best effort; if that release came before
// the statement committed, the slot is held until its TTL ends.
type Semaphore struct {
	db
	pollMin time.Duration
	pollMax time.Duration
}

// NewSemaphore returns a semaphore on pool tuned by cfg (at most one;
// none: the zero SemaphoreConfig). A node's is Stores.Semaphore, on the
// ledger pool.
func NewSemaphore(pool *Pool, config ...SemaphoreConfig) *Semaphore {
	cfg := configOf(config)
	if cfg.PollMin <= 0 {
		cfg.PollMin = 10 * time.Millisecond
	}
	if cfg.PollMax <= 0 {
		cfg.PollMax = 500 * time.Millisecond
	}
	cfg.PollMax = max(cfg.PollMax, cfg.PollMin)
	return &Semaphore{db: newDB(pool, cfg.Logger), pollMin: cfg.PollMin, pollMax: cfg.PollMax}
}

// releaseTimeout bounds a Release, which runs even after the caller's
// context ended (a cancelled call gives its slots back); an acquire cut off
// mid-statement is released within cutAcquireReleaseTimeout.
const (
	releaseTimeout           = 5 * time.Second
	cutAcquireReleaseTimeout = time.Second
)

// checkRequest validates an acquire and returns its keys and limits.
func checkRequest(holder string, want []SlotRequest, ttl time.Duration) ([]string, []int32, error) {
	switch {
	case holder == "":
		return nil, nil, errors.New("holder is empty")
	case len(holder) > maxHolderBytes:
		return nil, nil, fmt.Errorf("holder is %d bytes, more than %d", len(holder), maxHolderBytes)
	case len(want) == 0:
		return nil, nil, errors.New("no keys asked for: want at least one")
	case len(want) > MaxSlotKeys:
		return nil, nil, fmt.Errorf("%d keys asked for, more than %d", len(want), MaxSlotKeys)
	case ttl <= 0 || ttl > MaxSlotTTL:
		return nil, nil, fmt.Errorf("ttl %s out of range: must be more than 0 and at most %s", ttl, MaxSlotTTL)
	}
	keys := make([]string, len(want))
	limits := make([]int32, len(want))
	seen := make(map[string]int, len(want))
	for i, w := range want {
		switch j, dup := seen[w.Key]; {
		case w.Key == "":
			return nil, nil, fmt.Errorf("want[%d].Key is empty", i)
		case len(w.Key) > maxSlotKeyBytes:
			return nil, nil, fmt.Errorf("want[%d].Key is %d bytes, more than %d", i, len(w.Key), maxSlotKeyBytes)
		case w.Limit < 1 || w.Limit > MaxSlotLimit:
			return nil, nil, fmt.Errorf("want[%d].Limit (key %s) is %d: must be 1 to %d", i, w.Key, w.Limit, MaxSlotLimit)
		case dup:
			return nil, nil, fmt.Errorf("want[%d].Key %s is asked for twice (also want[%d])", i, w.Key, j)
		}
		seen[w.Key] = i
		keys[i] = w.Key
		limits[i] = int32(w.Limit)
	}
	return keys, limits, nil
}

// newLeaseID returns a random lease id, never 0. Two leases share one only
// with odds of about 2^-63 per pair.
func newLeaseID() int64 {
	for {
		if id := rand.Int64(); id != 0 {
			return id
		}
	}
}

// TryAcquire takes one slot of every requested key in one statement, or
// none: ok is false if any key has no free slot (a slot below its limit
// whose lease ended or was released), or if holders of that key already
// fill its limit. The lease ends TTL after the database granted it.
func (s *Semaphore) TryAcquire(ctx context.Context, holder string, want []SlotRequest, ttl time.Duration) (SlotLease, bool, error) {
	keys, limits, err := checkRequest(holder, want, ttl)
	if err != nil {
		return SlotLease{}, false, fmt.Errorf("acquire slots: %w", err)
	}
	lease, full, err := s.tryAcquire(ctx, newLeaseID(), holder, keys, limits, ttl)
	return lease, err == nil && full == "", err
}

// tryAcquire runs one acquire of lease id and returns the lease, or the
// first key that had no free slot.
func (s *Semaphore) tryAcquire(ctx context.Context, id int64, holder string, keys []string, limits []int32, ttl time.Duration) (SlotLease, string, error) {
	var full *string
	var asked time.Time
	err := retried(ctx, s.log, "semaphore.acquire", idempotent, func(ctx context.Context, _ try) error {
		// The database grants (or renews, for a try that finds its own
		// earlier grant) from its now(), later than this.
		asked = time.Now()
		return s.pool.QueryRow(ctx, `SELECT semaphore_acquire($1, $2, $3, $4, $5)`, id, holder, keys, limits, ttl).Scan(&full)
	})
	if class, _ := classify(err); err != nil && (ctx.Err() != nil || class == ambiguous) {
		// The statement may have committed with its reply lost (the
		// caller's context ended while it ran, or the connection did):
		// give back whatever it took, a no-op if it took nothing. Briefly:
		// the caller's deadline has passed.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cutAcquireReleaseTimeout)
		_ = s.release(rctx, SlotLease{ID: id, Holder: holder, Keys: keys}, 0)
		cancel()
	}
	if err != nil {
		return SlotLease{}, "", fmt.Errorf("acquire slots of %s: %w", strings.Join(keys, ", "), err)
	}
	if full != nil {
		return SlotLease{}, *full, nil
	}
	return SlotLease{ID: id, Holder: holder, Keys: keys, TTL: ttl, Asked: asked}, "", nil
}

// Acquire polls TryAcquire with jittered exponential backoff (from
// SemaphoreConfig.PollMin doubling to PollMax) until it succeeds or ctx
// ends: then its error wraps context.Cause(ctx) and names the key that had
// no free slot.
func (s *Semaphore) Acquire(ctx context.Context, holder string, want []SlotRequest, ttl time.Duration) (SlotLease, error) {
	keys, limits, err := checkRequest(holder, want, ttl)
	if err != nil {
		return SlotLease{}, fmt.Errorf("acquire slots: %w", err)
	}
	id := newLeaseID() // one per Acquire: a try cut off mid-flight is released by it
	start := time.Now()
	wait := s.pollMin
	full := ""
	waited := func() error {
		what := "before any answer"
		if full != "" {
			what = fmt.Sprintf("key %s had no free slot (limit %d)", full, limitOf(keys, limits, full))
		}
		return fmt.Errorf("acquire slots of %s: %s after waiting %s: %w", strings.Join(keys, ", "), what,
			time.Since(start).Round(time.Millisecond), context.Cause(ctx))
	}
	for {
		lease, f, err := s.tryAcquire(ctx, id, holder, keys, limits, ttl)
		switch {
		case err != nil && ctx.Err() != nil:
			return SlotLease{}, waited()
		case err != nil:
			return SlotLease{}, err
		case f == "":
			return lease, nil
		}
		full = f
		timer := time.NewTimer(wait/2 + rand.N(wait/2+1))
		select {
		case <-ctx.Done():
			timer.Stop()
			return SlotLease{}, waited()
		case <-timer.C:
		}
		wait = min(2*wait, s.pollMax)
	}
}

func limitOf(keys []string, limits []int32, key string) int32 {
	for i, k := range keys {
		if k == key {
			return limits[i]
		}
	}
	return 0
}

// checkLease validates a lease for renew and hold.
func checkLease(lease *SlotLease) error {
	switch {
	case lease == nil:
		return errors.New("no lease")
	case lease.ID == 0:
		return errors.New("lease has no ID: it was not granted")
	case lease.Holder == "":
		return fmt.Errorf("lease %d has no holder", lease.ID)
	case len(lease.Keys) == 0:
		return fmt.Errorf("lease %d has no keys", lease.ID)
	case lease.TTL <= 0 || lease.TTL > MaxSlotTTL:
		return fmt.Errorf("lease %d: ttl %s out of range: must be more than 0 and at most %s", lease.ID, lease.TTL, MaxSlotTTL)
	}
	return nil
}

// Renew extends lease by its TTL from now (database time) and updates
// lease.Asked; it returns ErrSlotLost if the lease had ended (it expired,
// and perhaps another holder took a slot). After ErrSlotLost the slots the
// lease still held are renewed; Release gives them back.
func (s *Semaphore) Renew(ctx context.Context, lease *SlotLease) error {
	if err := checkLease(lease); err != nil {
		return fmt.Errorf("renew slots: %w", err)
	}
	var n int
	var sent time.Time
	err := retried(ctx, s.log, "semaphore.renew", idempotent, func(ctx context.Context, _ try) error {
		sent = time.Now()
		return s.pool.QueryRow(ctx, `SELECT semaphore_renew($1, $2, $3)`, lease.ID, lease.Holder, lease.TTL).Scan(&n)
	})
	if err != nil {
		return fmt.Errorf("renew slots of %s (lease %d): %w", strings.Join(lease.Keys, ", "), lease.ID, err)
	}
	if n < len(lease.Keys) {
		return fmt.Errorf("renew slots of %s (lease %d): %d of %d still held: %w",
			strings.Join(lease.Keys, ", "), lease.ID, n, len(lease.Keys), ErrSlotLost)
	}
	lease.Asked = sent
	return nil
}

// Release frees lease's slots after grace (0: now). A cancelled call's
// slots are released with a grace because the server may still be running
// it. Release runs even when ctx has ended (for up to 5s), and touches no
// slot another lease took after this one expired. A grace more than 0
// keeps a slot that had already expired, if nobody took it, for the grace
// too.
func (s *Semaphore) Release(ctx context.Context, lease SlotLease, grace time.Duration) error {
	if grace < 0 || grace > MaxSlotTTL {
		return fmt.Errorf("release slots of lease %d: grace %s out of range: must be 0 to %s", lease.ID, grace, MaxSlotTTL)
	}
	if lease.ID == 0 || lease.Holder == "" {
		return fmt.Errorf("release slots: lease %d of holder %q was not granted", lease.ID, lease.Holder)
	}
	return s.release(ctx, lease, grace)
}

// release runs semaphore_release under ctx's deadline, or releaseTimeout
// if ctx has ended or has none sooner.
func (s *Semaphore) release(ctx context.Context, lease SlotLease, grace time.Duration) error {
	limit := time.Now().Add(releaseTimeout)
	if d, ok := ctx.Deadline(); ok && ctx.Err() == nil && d.Before(limit) {
		limit = d
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), limit)
	defer cancel()
	err := retried(ctx, s.log, "semaphore.release", idempotent, func(ctx context.Context, _ try) error {
		_, err := s.pool.Exec(ctx, `SELECT semaphore_release($1, $2, $3)`, lease.ID, lease.Holder, grace)
		return err
	})
	if err != nil {
		s.log.WarnContext(ctx, "release semaphore slots; they are free when their lease ends",
			"keys", lease.Keys, "lease", lease.ID, "err", err)
		return fmt.Errorf("release slots of %s (lease %d): %w", strings.Join(lease.Keys, ", "), lease.ID, err)
	}
	return nil
}

// Hold runs fn while renewing lease every TTL/3, and cancels fn's context
// with cause ErrSlotLost a margin (TTL/10) before a lease it could not
// renew ends. It returns fn's error, wrapped with that cause if the lease
// was lost. lease is updated by each renewal (Asked): fn must not use it.
func (s *Semaphore) Hold(ctx context.Context, lease *SlotLease, fn func(ctx context.Context) error) error {
	if err := checkLease(lease); err != nil {
		return fmt.Errorf("hold slots: %w", err)
	}
	if lease.Asked.IsZero() {
		return fmt.Errorf("hold slots of lease %d: Asked is not set", lease.ID)
	}
	fnCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	wg.Go(func() { s.keepRenewed(fnCtx, cancel, lease) })
	err := fn(fnCtx)
	if cause := context.Cause(fnCtx); err != nil && ctx.Err() == nil && errors.Is(cause, ErrSlotLost) && !errors.Is(err, ErrSlotLost) {
		err = fmt.Errorf("%w: %w", cause, err)
	}
	cancel(nil)
	wg.Wait()
	return err
}

// keepRenewed renews lease every TTL/3 until ctx ends, and cancels ctx
// (cause wrapping ErrSlotLost) when the lease is lost or would end before a
// renewal came through.
//
// The database started the lease when it granted it: after the acquire was
// sent, but possibly well before the grant arrived (a slow reply, a retry),
// so the lease is timed from lease.Asked, and each renewal from when it was
// sent. Only this node's monotonic clock is used, never compared with the
// database's. The call stops a margin before the lease could end: a
// renewal is given TTL/3 to answer, and never past that point. A renewal
// that fails for another reason than a lost lease (the database is away)
// is tried again every TTL/10 until then, like subagent's renewLease does
// for reservations.
func (s *Semaphore) keepRenewed(ctx context.Context, cancel context.CancelCauseFunc, lease *SlotLease) {
	ttl := lease.TTL
	margin := ttl / 10
	leaseEnd := lease.Asked.Add(ttl)
	expire := time.NewTimer(time.Until(leaseEnd.Add(-margin)))
	defer expire.Stop()
	renew := time.NewTimer(time.Until(lease.Asked.Add(ttl / 3)))
	defer renew.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-expire.C:
			cancel(fmt.Errorf("slots of %s (lease %d): the lease would end before a renewal came through: %w",
				strings.Join(lease.Keys, ", "), lease.ID, ErrSlotLost))
			return
		case <-renew.C:
			deadline := time.Now().Add(ttl / 3)
			if stop := leaseEnd.Add(-margin); stop.Before(deadline) {
				deadline = stop
			}
			rctx, rcancel := context.WithDeadline(ctx, deadline)
			err := s.Renew(rctx, lease)
			rcancel()
			switch {
			case err == nil:
				leaseEnd = lease.Asked.Add(ttl)
				expire.Reset(time.Until(leaseEnd.Add(-margin)))
				renew.Reset(time.Until(lease.Asked.Add(ttl / 3)))
			case errors.Is(err, ErrSlotLost):
				cancel(err)
				return
			case ctx.Err() != nil:
				return
			default:
				s.log.WarnContext(ctx, "renew semaphore slots; trying again until the lease would end",
					"keys", lease.Keys, "lease", lease.ID, "err", err)
				renew.Reset(max(margin, time.Millisecond))
			}
		}
	}
}

// InFlight reports how many slots of key are held now (unexpired),
// fleet-wide. A slot released with a grace counts until the grace ends.
func (s *Semaphore) InFlight(ctx context.Context, key string) (int, error) {
	if key == "" {
		return 0, errors.New("count slots in flight: key is empty")
	}
	var n int
	err := retried(ctx, s.log, "semaphore.in_flight", idempotent, func(ctx context.Context, _ try) error {
		return s.pool.QueryRow(ctx, `SELECT count(*) FROM semaphore_slot WHERE key = $1 AND expires_at > now()`, key).Scan(&n)
	})
	if err != nil {
		return 0, fmt.Errorf("count slots of %s in flight: %w", key, err)
	}
	return n, nil
}

// The held-slots gauge, fed by the health check (health.go), so that
// operators see the fleet's calls in flight per key.
const (
	metricSlotsHeld = "fanout.semaphore.slots.held"
	// AttrSemaphoreKey is the semaphore key of fanout.semaphore.slots.held
	// (an MCP server's or a tool's name, from the operator's config).
	AttrSemaphoreKey = attribute.Key("fanout.semaphore.key")
	// maxGaugeKeys bounds the gauge's cardinality: the busiest keys first.
	maxGaugeKeys = 256
)

// slotsHeld returns how many slots each key (at most maxGaugeKeys of
// them, busiest first) holds now, in the whole database; keys with none
// held report 0.
func slotsHeld(ctx context.Context, pool *pgxpool.Pool) (map[string]int64, error) {
	rows, err := pool.Query(ctx, `SELECT key, count(*) FILTER (WHERE expires_at > now())
		FROM semaphore_slot GROUP BY key ORDER BY 2 DESC, key LIMIT $1`, maxGaugeKeys)
	if err != nil {
		return nil, fmt.Errorf("count held semaphore slots: %w", err)
	}
	held := map[string]int64{}
	var key string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&key, &n}, func() error {
		held[key] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("count held semaphore slots: %w", err)
	}
	return held, nil
}

// slotGauge publishes the last slotsHeld as fanout.semaphore.slots.held;
// nothing until a count succeeded.
type slotGauge struct {
	mu   sync.Mutex
	last map[string]int64
	reg  metric.Registration
}

// newSlotGauge registers the gauge on m; stop unregisters it.
func newSlotGauge(m metric.Meter, log *slog.Logger) *slotGauge {
	g := &slotGauge{}
	held, err := m.Int64ObservableGauge(metricSlotsHeld, metric.WithUnit("{slot}"),
		metric.WithDescription("Semaphore slots held now in the whole database, by key: for a tool or an MCP server, its calls in flight across the fleet (up to its max_in_flight)."))
	if err == nil {
		g.reg, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			g.mu.Lock()
			defer g.mu.Unlock()
			for k, n := range g.last {
				o.ObserveInt64(held, n, metric.WithAttributes(AttrSemaphoreKey.String(k)))
			}
			return nil
		}, held)
	}
	if err != nil {
		log.Warn("semaphore slots gauge off", "err", err)
	}
	return g
}

// refresh counts the held slots again.
func (g *slotGauge) refresh(ctx context.Context, pool *pgxpool.Pool) error {
	held, err := slotsHeld(ctx, pool)
	if err != nil {
		return err
	}
	g.mu.Lock()
	g.last = held
	g.mu.Unlock()
	return nil
}

func (g *slotGauge) stop() {
	if g.reg != nil {
		_ = g.reg.Unregister()
	}
}
