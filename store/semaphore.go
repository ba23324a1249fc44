package store

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrSlotLost is the cause of a Hold's cancel, and Renew's error, when a
// slot lease ended (it expired, perhaps taken by another holder) before it
// could be renewed.
var ErrSlotLost = errors.New("semaphore slot lease lost")

// SlotRequest asks for one slot of Key, whose bound is Limit (>= 1). The
// limit is the caller's at each acquire, as RateLimiter.Define's limits are.
type SlotRequest struct {
	Key   string
	Limit int
}

// SlotLease is a held set of slots, one per requested key, taken together.
type SlotLease struct {
	ID     int64
	Holder string
	Keys   []string
	TTL    time.Duration
	// Asked is when the acquiring (or last renewing) statement was sent on
	// this node's monotonic clock: the lease is timed from it.
	Asked time.Time
}

// SemaphoreConfig tunes a Semaphore.
type SemaphoreConfig struct {
	Logger  *slog.Logger  // default slog.Default()
	PollMin time.Duration // first wait of a waiter, jittered; default 10ms
	PollMax time.Duration // cap of a waiter's backoff; default 500ms
}

// Semaphore is a fleet-wide counting semaphore: leased slots in Postgres
// (TODO: implementation in progress).
type Semaphore struct {
	pool *pgxpool.Pool
	cfg  SemaphoreConfig
}

// NewSemaphore returns a semaphore on pool.
func NewSemaphore(pool *pgxpool.Pool, cfg SemaphoreConfig) *Semaphore {
	return &Semaphore{pool: pool, cfg: cfg}
}

var errUnimplemented = errors.New("semaphore: not implemented yet")

// TryAcquire takes one slot of every requested key in one statement, or
// none: ok is false if any key has no free slot.
func (s *Semaphore) TryAcquire(ctx context.Context, holder string, want []SlotRequest, ttl time.Duration) (SlotLease, bool, error) {
	return SlotLease{}, false, errUnimplemented
}

// Acquire polls TryAcquire with jittered backoff until it succeeds or ctx
// ends (then its error wraps context.Cause(ctx)).
func (s *Semaphore) Acquire(ctx context.Context, holder string, want []SlotRequest, ttl time.Duration) (SlotLease, error) {
	return SlotLease{}, errUnimplemented
}

// Renew extends lease by its TTL from now (database time) and updates
// lease.Asked; it returns ErrSlotLost if the lease had ended.
func (s *Semaphore) Renew(ctx context.Context, lease *SlotLease) error { return errUnimplemented }

// Release frees lease's slots after grace (0: now). A cancelled call's
// slots are released with a grace because the server may still be running
// it.
func (s *Semaphore) Release(ctx context.Context, lease SlotLease, grace time.Duration) error {
	return errUnimplemented
}

// Hold runs fn while renewing lease every TTL/3, and cancels fn's context
// with cause ErrSlotLost a margin before a lease it could not renew ends.
func (s *Semaphore) Hold(ctx context.Context, lease *SlotLease, fn func(ctx context.Context) error) error {
	return errUnimplemented
}

// InFlight reports how many slots of key are held now (unexpired).
func (s *Semaphore) InFlight(ctx context.Context, key string) (int, error) {
	return 0, errUnimplemented
}
