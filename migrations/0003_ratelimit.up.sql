-- Fleet-wide provider rate limits: one token bucket row per provider key
-- (bucket = provider:key-id, never the key), holding a request balance and a
-- token balance refilled continuously by database time. Every worker debits
-- the same row before each model call, in one UPDATE whose WHERE re-checks
-- the balance under the row lock, so N workers together keep one limit.

CREATE TABLE rate_bucket (
    bucket      text PRIMARY KEY CHECK (bucket <> '' AND octet_length(bucket) <= 128),
    -- Limits per minute; 0 = that dimension is unlimited.
    rpm         bigint NOT NULL CHECK (rpm >= 0),
    tpm         bigint NOT NULL CHECK (tpm >= 0),
    -- burst: how much of a minute's rate the bucket holds.
    burst       interval NOT NULL CHECK (burst > interval '0'),
    -- Balances as of refilled_at. tokens may be negative: a call larger than
    -- the bucket's capacity passes on a full bucket and leaves it in debt.
    requests    double precision NOT NULL DEFAULT 0,
    tokens      double precision NOT NULL DEFAULT 0,
    refilled_at timestamptz NOT NULL DEFAULT now(),
    taken       bigint NOT NULL DEFAULT 0 CHECK (taken >= 0) -- takes granted, for operators
);

-- rate_capacity is what a bucket of per_minute with burst holds: at least 1.
CREATE FUNCTION rate_capacity(per_minute bigint, burst interval) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN greatest(1, per_minute * extract(epoch FROM burst) / 60.0);

-- rate_refill is balance refilled from since to at, capped at the capacity.
-- A clock that went backwards (a transaction started before the last
-- refill committed) refills nothing.
CREATE FUNCTION rate_refill(balance double precision, per_minute bigint, burst interval,
                            since timestamptz, at timestamptz) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN least(rate_capacity(per_minute, burst),
             balance + per_minute / 60.0 * greatest(0, extract(epoch FROM at - since)));

GRANT SELECT, INSERT, UPDATE ON rate_bucket TO fanout_app;
GRANT EXECUTE ON FUNCTION rate_capacity(bigint, interval), rate_refill(double precision, bigint, interval, timestamptz, timestamptz) TO fanout_app;
