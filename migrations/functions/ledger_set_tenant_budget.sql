-- ledger_set_tenant_budget creates the tenant and its account if missing,
-- or changes its budget under the account's lock (starting the next period
-- first if the current one ended); posts the change of limit as an entry
-- ('open' for a new account, 'adjust' otherwise) and logs the action. Every
-- run of the tenant in flight is under the budget from this commit
-- (ledger_adopt_runs), and a tenant left below its minimum is exhausted.
-- A changed period kind (or length) starts a new period now; a changed
-- limit applies to the current one. p_min NULL keeps the tenant's
-- min_reservation (1 for a new account). Returns the account.
CREATE OR REPLACE FUNCTION ledger_set_tenant_budget(p_actor text, p_tenant text, p_limit bigint, p_kind text,
                                         p_every interval, p_min bigint DEFAULT NULL)
RETURNS SETOF account
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    t         account;
    e         bigint;
    new_limit bigint;
    new_end   timestamptz;
    fresh     boolean := false;
    prior     jsonb;
BEGIN
    IF p_actor IS NULL OR p_actor = '' OR p_tenant IS NULL OR p_tenant = '' OR length(p_tenant) > 128
       OR p_limit IS NULL OR p_limit <= 0 OR p_kind IS NULL OR p_kind NOT IN ('none', 'day', 'month', 'every')
       OR (p_kind = 'every') IS DISTINCT FROM (p_every IS NOT NULL)
       OR (p_every IS NOT NULL AND p_every < interval '1 second')
       OR (p_min IS NOT NULL AND (p_min <= 0 OR p_min > p_limit)) THEN
        RAISE EXCEPTION 'ledger_set_tenant_budget: actor %, tenant %, limit %, period % every %, min % out of range (limit > 0, period none|day|month|every, every >= 1 second and only with every, min in 1..limit)',
            p_actor, p_tenant, p_limit, p_kind, p_every, p_min
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_kind = 'none' THEN
        p_every := NULL;
    END IF;
    INSERT INTO tenant (tenant_id) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    -- Waits for runs being opened (ledger_open_run shares this row), so
    -- that the adoption below sees them.
    PERFORM FROM tenant WHERE tenant_id = p_tenant FOR UPDATE;
    SELECT * INTO t FROM account WHERE tenant_id = p_tenant AND kind = 'tenant' FOR UPDATE;
    IF NOT FOUND THEN
        new_end := CASE WHEN p_kind = 'none' THEN NULL ELSE ledger_period_next_end(p_kind, p_every, now(), now()) END;
        INSERT INTO account (tenant_id, chain, kind, limit_tokens, min_reservation, period_kind, period_every,
                             period_limit, period_end)
        VALUES (p_tenant, '{}', 'tenant', p_limit, coalesce(p_min, 1), p_kind, p_every, p_limit, new_end)
        ON CONFLICT (tenant_id) WHERE kind = 'tenant' DO NOTHING
        RETURNING * INTO t;
        IF NOT FOUND THEN
            -- Opened by a concurrent call: change it under its lock.
            SELECT * INTO t FROM account WHERE tenant_id = p_tenant AND kind = 'tenant' FOR UPDATE;
        ELSE
            fresh := true;
            UPDATE account SET chain = ARRAY[account_id] WHERE account_id = t.account_id RETURNING * INTO t;
            INSERT INTO ledger_entry (tenant_id, account_id, chain, kind, delta_limit, note)
            VALUES (p_tenant, t.account_id, t.chain, 'open', p_limit, 'tenant account')
            RETURNING entry_id INTO e;
            INSERT INTO tenant_period (account_id, tenant_id, period_kind, period_start, period_end, first_entry_id)
            VALUES (t.account_id, p_tenant, p_kind,
                    CASE WHEN p_kind IN ('day', 'month') THEN ledger_period_start(p_kind, p_every, new_end) ELSE now() END,
                    new_end, e);
        END IF;
    END IF;
    IF NOT fresh THEN
        prior := jsonb_build_object('limit', t.period_limit, 'period', t.period_kind,
                                    'every', t.period_every::text, 'min_reservation', t.min_reservation);
        t := ledger_roll_period(t);
        IF t.period_kind IS DISTINCT FROM p_kind OR t.period_every IS DISTINCT FROM p_every THEN
            -- A new kind of period starts now, from what is spent now.
            new_end := CASE WHEN p_kind = 'none' THEN NULL ELSE ledger_period_next_end(p_kind, p_every, now(), now()) END;
            t := ledger_post_slices(t, new_end);
            new_limit := greatest(t.spent + p_limit, t.spent + t.reserved + t.held);
            INSERT INTO ledger_entry (tenant_id, account_id, chain, kind, delta_limit, note)
            VALUES (p_tenant, t.account_id, t.chain, 'adjust', new_limit - t.limit_tokens,
                    format('budget set to %s per %s%s by %s; a new period starts', p_limit, p_kind,
                           coalesce(' of ' || p_every::text, ''), p_actor))
            RETURNING entry_id INTO e;
            UPDATE tenant_period SET period_end = now()
             WHERE account_id = t.account_id
               AND first_entry_id = (SELECT max(first_entry_id) FROM tenant_period WHERE account_id = t.account_id);
            INSERT INTO tenant_period (account_id, tenant_id, period_kind, period_start, period_end, first_entry_id)
            VALUES (t.account_id, p_tenant, p_kind, now(), new_end, e);
            UPDATE account SET limit_tokens = new_limit, period_kind = p_kind, period_every = p_every,
                               period_limit = p_limit, period_base = t.spent, period_end = new_end,
                               min_reservation = coalesce(p_min, min_reservation), updated_at = now()
             WHERE account_id = t.account_id
            RETURNING * INTO t;
        ELSE
            new_limit := greatest(t.period_base + p_limit, t.spent + t.reserved + t.held);
            INSERT INTO ledger_entry (tenant_id, account_id, chain, kind, delta_limit, note)
            VALUES (p_tenant, t.account_id, t.chain, 'adjust', new_limit - t.limit_tokens,
                    format('budget set to %s per %s%s by %s', p_limit, p_kind,
                           coalesce(' of ' || p_every::text, ''), p_actor));
            UPDATE account SET limit_tokens = new_limit, period_limit = p_limit,
                               min_reservation = coalesce(p_min, min_reservation), updated_at = now()
             WHERE account_id = t.account_id
            RETURNING * INTO t;
        END IF;
    END IF;
    -- Its runs in flight are under it from this commit, whatever they hold.
    t := ledger_adopt_runs(t);
    IF ledger_below_minimum(t, 0) THEN
        PERFORM ledger_exhaust_tenant(t);
    END IF;
    PERFORM admin_log(p_actor, 'tenant.set_budget', p_tenant,
        jsonb_build_object('limit', p_limit, 'period', p_kind, 'every', p_every::text,
                           'min_reservation', t.min_reservation, 'account_id', t.account_id,
                           'limit_tokens', t.limit_tokens, 'created', fresh, 'prior', prior));
    RETURN QUERY SELECT * FROM account WHERE account_id = t.account_id;
END $$;
REVOKE ALL ON FUNCTION ledger_set_tenant_budget(text,text,bigint,text,interval,bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_set_tenant_budget(text,text,bigint,text,interval,bigint) TO fanout_admin;
