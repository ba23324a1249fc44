-- rate_capacity is what a bucket of per_minute with burst holds: at least 1.
CREATE OR REPLACE FUNCTION rate_capacity(per_minute bigint, burst interval) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN greatest(1, per_minute * extract(epoch FROM burst) / 60.0);
REVOKE ALL ON FUNCTION rate_capacity(bigint,interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rate_capacity(bigint,interval) TO fanout_app, fanout_worker;
