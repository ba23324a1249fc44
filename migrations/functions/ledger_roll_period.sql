-- ledger_roll_period starts tenant account t's next period if its end has
-- passed, and returns the account as it then is. Callers hold t's lock.
CREATE OR REPLACE FUNCTION ledger_roll_period(t account) RETURNS account
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    new_end   timestamptz;
    new_limit bigint;
    e         bigint;
BEGIN
    IF t.period_end IS NULL OR now() < t.period_end THEN
        RETURN t;
    END IF;
    new_end := ledger_period_next_end(t.period_kind, t.period_every, t.period_end, now());
    -- What its slices spent before the end counts in the period that ends.
    t := ledger_post_slices(t, new_end);
    -- Clamped: what is held across the boundary stays within the limit.
    new_limit := greatest(t.spent + t.period_limit, t.spent + t.reserved + t.held);
    INSERT INTO ledger_entry (tenant_id, account_id, chain, kind, delta_limit, note)
    VALUES (t.tenant_id, t.account_id, ARRAY[t.account_id], 'period', new_limit - t.limit_tokens,
            format('period %s ended %s; next ends %s; limit = spent %s + period limit %s',
                   t.period_kind, t.period_end, new_end, t.spent, t.period_limit))
    RETURNING entry_id INTO e;
    INSERT INTO tenant_period (account_id, tenant_id, period_kind, period_start, period_end, first_entry_id)
    VALUES (t.account_id, t.tenant_id, t.period_kind,
            ledger_period_start(t.period_kind, t.period_every, new_end), new_end, e);
    UPDATE account SET limit_tokens = new_limit, period_base = t.spent, period_end = new_end, updated_at = now()
     WHERE account_id = t.account_id
    RETURNING * INTO t;
    RETURN t;
END $$;
REVOKE ALL ON FUNCTION ledger_roll_period(account) FROM PUBLIC;
