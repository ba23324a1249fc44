-- ledger_period_next_end is the first boundary of a period of p_kind
-- (p_every for 'every') after p_at, counted from p_from (the last end, or
-- the start for a new 'every' period).
CREATE OR REPLACE FUNCTION ledger_period_next_end(p_kind text, p_every interval, p_from timestamptz, p_at timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, fanout, pg_temp AS $$
    SELECT CASE p_kind
        WHEN 'day' THEN (date_trunc('day', p_at AT TIME ZONE 'UTC') + interval '1 day') AT TIME ZONE 'UTC'
        WHEN 'month' THEN (date_trunc('month', p_at AT TIME ZONE 'UTC') + interval '1 month') AT TIME ZONE 'UTC'
        WHEN 'every' THEN p_from + p_every * (floor(extract(epoch FROM p_at - p_from) / extract(epoch FROM p_every)) + 1)
    END
$$;
REVOKE ALL ON FUNCTION ledger_period_next_end(text,interval,timestamp with time zone,timestamp with time zone) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_period_next_end(text,interval,timestamp with time zone,timestamp with time zone) TO fanout_app, fanout_admin, fanout_auditor, fanout_tenant_auditor;
