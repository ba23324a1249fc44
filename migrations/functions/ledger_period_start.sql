-- ledger_period_start is when the period that ends at p_end started.
CREATE OR REPLACE FUNCTION ledger_period_start(p_kind text, p_every interval, p_end timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, fanout, pg_temp AS $$
    SELECT CASE p_kind
        WHEN 'day' THEN ((p_end AT TIME ZONE 'UTC') - interval '1 day') AT TIME ZONE 'UTC'
        WHEN 'month' THEN ((p_end AT TIME ZONE 'UTC') - interval '1 month') AT TIME ZONE 'UTC'
        WHEN 'every' THEN p_end - p_every
    END
$$;
REVOKE ALL ON FUNCTION ledger_period_start(text,interval,timestamp with time zone) FROM PUBLIC;
