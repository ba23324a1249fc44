DROP TABLE IF EXISTS rate_bucket;
DROP FUNCTION IF EXISTS rate_refill(double precision, bigint, interval, timestamptz, timestamptz);
DROP FUNCTION IF EXISTS rate_capacity(bigint, interval);
