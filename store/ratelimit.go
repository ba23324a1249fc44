package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrBucketNotDefined is returned by RateLimiter.Take and Refund for a
// bucket that Define never created.
var ErrBucketNotDefined = errors.New("rate limit bucket not defined")

// RateLimiter keeps provider rate limits fleet-wide: one rate_bucket row per
// provider key (rate_bucket; migrations/functions/rate_refill.sql), refilled by database time, debited by every
// worker before each model call. It implements llm.Limiter (whose methods use
// only standard types, so neither package imports the other).
//
// Define and Take are retried after a transient database error (retry.go);
// Refund only when the error proves it did not happen.
type RateLimiter struct {
	db
}

// RateLimiterConfig tunes a RateLimiter.
type RateLimiterConfig struct {
	// Logger receives a warning for every retried database error. Default
	// slog.Default().
	Logger *slog.Logger
}

// NewRateLimiter returns a rate limiter on pool tuned by cfg (at most one;
// none: the zero RateLimiterConfig). A worker's is Stores.RateLimiter, on
// the ledger pool; Keys holds one of its own on the API pool.
func NewRateLimiter(pool *Pool, config ...RateLimiterConfig) *RateLimiter {
	return &RateLimiter{db: newDB(pool, configOf(config).Logger)}
}

// Define creates bucket, empty, or changes its limits (balances are refilled
// at the old limits up to now, then capped at the new capacity). rpm or tpm
// 0 means unlimited; burst is how much of a minute's rate the bucket holds.
func (r *RateLimiter) Define(ctx context.Context, bucket string, rpm, tpm int64, burst time.Duration) error {
	if rpm < 0 || tpm < 0 || burst <= 0 {
		return fmt.Errorf("define rate bucket %s: rpm %d, tpm %d, burst %s: limits must be >= 0 and burst > 0", bucket, rpm, tpm, burst)
	}
	return r.define(ctx, bucket, rpm, tpm, burst, false)
}

// define is Define; full creates a new bucket full rather than empty (an
// API key's: a new key may send its burst at once).
func (r *RateLimiter) define(ctx context.Context, bucket string, rpm, tpm int64, burst time.Duration, full bool) error {
	// Idempotent: a second run finds the limits set and changes nothing.
	err := retried(ctx, r.log, "ratelimit.define", idempotent, func(ctx context.Context, _ try) error {
		_, err := r.pool.Exec(ctx, defineSQL, bucket, rpm, tpm, burst, full)
		return err
	})
	if err != nil {
		return fmt.Errorf("define rate bucket %s: %w", bucket, err)
	}
	return nil
}

// defineSQL creates a bucket (empty, or full when $5) or changes its
// limits, keeping its balances up to the new capacities (define).
const defineSQL = `
		INSERT INTO rate_bucket AS b (bucket, rpm, tpm, burst, requests, tokens)
		VALUES ($1, $2, $3, $4, CASE WHEN $5 THEN rate_capacity($2, $4) ELSE 0 END,
		        CASE WHEN $5 THEN rate_capacity($3, $4) ELSE 0 END)
		ON CONFLICT (bucket) DO UPDATE SET
			rpm = EXCLUDED.rpm, tpm = EXCLUDED.tpm, burst = EXCLUDED.burst,
			requests = least(rate_capacity(EXCLUDED.rpm, EXCLUDED.burst),
			                 rate_refill(b.requests, b.rpm, b.burst, b.refilled_at, now())),
			tokens = least(rate_capacity(EXCLUDED.tpm, EXCLUDED.burst),
			               rate_refill(b.tokens, b.tpm, b.burst, b.refilled_at, now())),
			refilled_at = greatest(b.refilled_at, now())
		WHERE (b.rpm, b.tpm, b.burst) IS DISTINCT FROM (EXCLUDED.rpm, EXCLUDED.tpm, EXCLUDED.burst)`

// takeSQL debits a bucket in one UPDATE whose WHERE checks the balances
// refilled to now(). Under READ COMMITTED a concurrent taker blocks on the
// row lock and then re-evaluates the WHERE against the committed row, so a
// burst of takers cannot all pass on one balance. When the UPDATE refuses,
// the SELECT computes, from the statement's snapshot, how long until the
// balances would cover the take: a hint, not a promise.
const takeSQL = `
WITH take AS (
	UPDATE rate_bucket SET
		requests = CASE WHEN rpm > 0 THEN rate_refill(requests, rpm, burst, refilled_at, now()) - $2::bigint ELSE 0 END,
		tokens = CASE WHEN tpm > 0 THEN rate_refill(tokens, tpm, burst, refilled_at, now()) - $3::bigint ELSE 0 END,
		refilled_at = greatest(refilled_at, now()),
		taken = taken + 1
	WHERE bucket = $1
	  AND (rpm = 0 OR rate_refill(requests, rpm, burst, refilled_at, now()) >= least($2::bigint, rate_capacity(rpm, burst)))
	  AND (tpm = 0 OR rate_refill(tokens, tpm, burst, refilled_at, now()) >= least($3::bigint, rate_capacity(tpm, burst)))
	RETURNING 1
)
SELECT EXISTS (SELECT FROM take),
	(SELECT greatest(
		CASE WHEN rpm > 0 THEN (least($2::bigint, rate_capacity(rpm, burst))
			- rate_refill(requests, rpm, burst, refilled_at, now())) * 60.0 / rpm ELSE 0 END,
		CASE WHEN tpm > 0 THEN (least($3::bigint, rate_capacity(tpm, burst))
			- rate_refill(tokens, tpm, burst, refilled_at, now())) * 60.0 / tpm ELSE 0 END)
	 FROM rate_bucket WHERE bucket = $1)`

// minWait is the wait reported when a take was refused but the snapshot
// already shows enough: a concurrent taker got there first.
const minWait = 5 * time.Millisecond

// Take debits requests and tokens from bucket if its balances cover them
// and returns 0, or debits nothing and returns how long to wait. A take
// larger than the bucket's capacity passes on a full bucket, leaving it in
// debt. It returns ErrBucketNotDefined for an unknown bucket.
func (r *RateLimiter) Take(ctx context.Context, bucket string, requests, tokens int64) (time.Duration, error) {
	var granted bool
	var wait *float64
	// Not idempotent, but safe to retry even when a try's commit was
	// ambiguous: a lost try that committed debited the bucket once more,
	// which only makes the limiter stricter for a moment (by one call's
	// worth), never lets more through than the provider's limits.
	err := retried(ctx, r.log, "ratelimit.take", idempotent, func(ctx context.Context, _ try) error {
		return r.pool.QueryRow(ctx, takeSQL, bucket, requests, tokens).Scan(&granted, &wait)
	})
	if err != nil {
		return 0, fmt.Errorf("take %d requests and %d tokens from rate bucket %s: %w", requests, tokens, bucket, err)
	}
	switch {
	case granted:
		return 0, nil
	case wait == nil:
		return 0, fmt.Errorf("take from rate bucket %s: %w", bucket, ErrBucketNotDefined)
	}
	return max(minWait, time.Duration(*wait*float64(time.Second))), nil
}

// Refund credits tokens back to bucket, up to its capacity (a negative
// refund debits more). It returns ErrBucketNotDefined for an unknown bucket.
func (r *RateLimiter) Refund(ctx context.Context, bucket string, tokens int64) error {
	// A second credit after a lost try that committed would let more
	// through than the limits: retried only when nothing happened.
	tag, err := retry(ctx, r.log, "ratelimit.refund", unsentOnly, func(ctx context.Context, _ try) (pgconn.CommandTag, error) {
		return r.pool.Exec(ctx, `
			UPDATE rate_bucket SET
				requests = CASE WHEN rpm > 0 THEN rate_refill(requests, rpm, burst, refilled_at, now()) ELSE 0 END,
				tokens = CASE WHEN tpm > 0 THEN least(rate_capacity(tpm, burst),
					rate_refill(tokens, tpm, burst, refilled_at, now()) + $2::bigint) ELSE 0 END,
				refilled_at = greatest(refilled_at, now())
			WHERE bucket = $1`, bucket, tokens)
	})
	if err != nil {
		return fmt.Errorf("refund %d tokens to rate bucket %s: %w", tokens, bucket, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("refund to rate bucket %s: %w", bucket, ErrBucketNotDefined)
	}
	return nil
}
