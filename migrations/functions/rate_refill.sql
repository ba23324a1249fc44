-- rate_refill is balance refilled from since to at, capped at the capacity.
-- A clock that went backwards (a transaction started before the last
-- refill committed) refills nothing.
CREATE OR REPLACE FUNCTION rate_refill(balance double precision, per_minute bigint, burst interval,
                            since timestamptz, at timestamptz) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN least(rate_capacity(per_minute, burst),
             balance + per_minute / 60.0 * greatest(0, extract(epoch FROM at - since)));
REVOKE ALL ON FUNCTION rate_refill(double precision,bigint,interval,timestamp with time zone,timestamp with time zone) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rate_refill(double precision,bigint,interval,timestamp with time zone,timestamp with time zone) TO fanout_app, fanout_worker;
