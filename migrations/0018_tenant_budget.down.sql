-- Reverts 0018: tenant accounts lose their period; the ledger functions are
-- 0005's again. The 'period' and 'adjust' entries stay (the journal is
-- append-only), so the restored kind CHECK is NOT VALID for rows already
-- there.

SET LOCAL search_path = fanout, pg_catalog;

DROP VIEW tenant_period_spend;
DROP VIEW tenant_budget;
DROP FUNCTION ledger_set_tenant_budget(text, text, bigint, text, interval, bigint);

CREATE OR REPLACE FUNCTION ledger_reserve(p_account bigint, p_run text, p_tenant text, p_attempt bigint,
                               p_want bigint, p_min bigint, p_holder text, p_ttl interval, p_key text)
RETURNS ledger_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    leaf  account;
    a     account;
    locked account[] := '{}';
    ended account;
    r     reservation;
    g     bigint := p_want;
    res   ledger_result;
    run   account;
BEGIN
    IF p_want IS NULL OR p_min IS NULL OR p_want <= 0 OR p_min <= 0 OR p_min > p_want
       OR p_holder IS NULL OR p_holder = '' OR p_attempt IS NULL OR p_attempt < 1
       OR p_ttl IS NULL OR p_ttl <= interval '0' OR p_ttl > interval '1 hour' THEN
        RAISE EXCEPTION 'ledger_reserve: want %, min %, holder %, attempt %, ttl % out of range (ttl at most 1 hour)',
            p_want, p_min, p_holder, p_attempt, p_ttl
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO leaf FROM account WHERE account_id = p_account;
    IF NOT FOUND THEN
        res.outcome := 'not_found';
        RETURN res;
    END IF;
    -- The grant: an account of the named run and tenant. Said without
    -- naming what the account does belong to.
    IF leaf.kind = 'tenant' OR leaf.run_id IS DISTINCT FROM p_run OR leaf.tenant_id IS DISTINCT FROM p_tenant THEN
        RETURN ledger_refusal('denied', p_account,
            format('not an account of run %s of tenant %s', p_run, p_tenant));
    END IF;
    FOR a IN SELECT * FROM ledger_lock_chain(leaf.chain) LOOP
        IF a.account_id = leaf.account_id THEN
            leaf := a; -- as of the lock: its attempt cannot move under us
        END IF;
        IF a.state <> 'open' AND ended.account_id IS NULL THEN
            ended := a;
        END IF;
        IF a.kind = 'run' THEN
            run := a;
        END IF;
        locked := locked || a;
    END LOOP;
    IF leaf.attempt IS DISTINCT FROM p_attempt THEN
        RETURN ledger_refusal('denied', p_account,
            format('attempt %s is not the current attempt %s', p_attempt, leaf.attempt));
    END IF;
    IF p_key IS NOT NULL THEN
        -- Checked under the chain lock, so a concurrent duplicate has committed.
        SELECT * INTO r FROM reservation WHERE account_id = p_account AND reserve_key = p_key;
        IF FOUND THEN
            IF r.state <> 'held' THEN
                res := ledger_result_of('resolved', r);
                res.info := format('the key names reservation %s, which is %s', r.reservation_id, r.state);
                RETURN res;
            ELSIF r.holder <> p_holder THEN
                res := ledger_refusal('conflict', p_account,
                    format('the key names reservation %s, held by another node', r.reservation_id));
                RETURN res;
            ELSIF ended.account_id IS NULL OR ended.state = 'exhausted' THEN
                -- A retry of a granted call whose reply was lost gets its
                -- reservation back (also when that grant exhausted the run:
                -- under DRAIN it may still be used).
                RETURN ledger_result_of('replay', r);
            END IF;
            -- The run was cancelled or closed meanwhile. The holder is asking
            -- again, so it never had the grant and never started a call on
            -- it: free it.
            PERFORM ledger_void(r.reservation_id, r.generation, 'reserve retried on an ended account');
        END IF;
    END IF;
    IF ended.account_id IS NOT NULL THEN
        res.outcome := 'exhausted';
        res.info_account := ended.account_id;
        res.info_kind := ended.kind;
        res.info_state := ended.state;
        res.info_available := ended.limit_tokens - ended.reserved - ended.spent;
        RETURN res;
    END IF;
    FOREACH a IN ARRAY locked LOOP
        IF least(g, a.limit_tokens - a.reserved - a.spent) < p_min THEN
            res.outcome := 'exhausted';
            res.info_account := a.account_id;
            res.info_kind := a.kind;
            res.info_state := a.state;
            res.info_available := a.limit_tokens - a.reserved - a.spent;
            RETURN res;
        END IF;
        g := least(g, a.limit_tokens - a.reserved - a.spent);
    END LOOP;

    UPDATE account SET reserved = reserved + g, updated_at = now()
     WHERE account_id = ANY (leaf.chain);
    INSERT INTO reservation (tenant_id, run_id, account_id, chain, requested, amount, holder,
                             lease_expires_at, reserve_key, attempt)
    VALUES (leaf.tenant_id, leaf.run_id, leaf.account_id, leaf.chain, p_want, g, p_holder,
            now() + p_ttl, p_key, p_attempt)
    RETURNING * INTO r;
    INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, reservation_id,
                              kind, delta_reserved, holder)
    VALUES (leaf.tenant_id, leaf.run_id, leaf.task_id, leaf.account_id, leaf.chain,
            r.reservation_id, 'reserve', g, p_holder);
    -- Only a grant that takes the run below its minimum ends it (saves a
    -- statement on the hot path).
    IF run.account_id IS NOT NULL AND run.limit_tokens - run.reserved - g - run.spent < run.min_reservation THEN
        PERFORM ledger_check_exhausted(leaf.chain);
    END IF;
    res := ledger_result_of('ok', r);
    res.run_available := run.limit_tokens - run.reserved - g - run.spent;
    RETURN res;
END $$;

CREATE OR REPLACE FUNCTION ledger_settle(p_reservation bigint, p_generation bigint, p_actual bigint,
                              p_estimated boolean)
RETURNS ledger_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    r      reservation;
    a      account;
    run    account;
    charge bigint := p_actual;
    res    ledger_result;
BEGIN
    IF p_actual IS NULL OR p_actual < 0 THEN
        RAISE EXCEPTION 'ledger_settle: actual % out of range', p_actual USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO r FROM reservation WHERE reservation_id = p_reservation;
    IF NOT FOUND THEN
        res.outcome := 'not_found';
        RETURN res;
    END IF;
    FOR a IN SELECT * FROM ledger_lock_chain(r.chain) LOOP
        charge := least(charge, a.limit_tokens - (a.reserved - r.amount) - a.spent);
        IF a.kind = 'run' THEN
            run := a;
        END IF;
    END LOOP;
    SELECT * INTO r FROM reservation WHERE reservation_id = p_reservation FOR UPDATE;
    IF r.state = 'settled' THEN
        IF r.actual = p_actual AND r.estimated = p_estimated THEN
            RETURN ledger_result_of('replay', r);
        END IF;
        res := ledger_result_of('conflict', r);
        res.info := format('already settled with actual %s (estimated %s), not %s', r.actual, r.estimated, p_actual);
        RETURN res;
    ELSIF r.state = 'expired' OR r.generation IS DISTINCT FROM p_generation THEN
        res := ledger_result_of('lease_lost', r);
        res.info := format('reservation is %s at generation %s; settle came with generation %s', r.state, r.generation, p_generation);
        RETURN res;
    ELSIF r.state = 'voided' THEN
        res := ledger_result_of('conflict', r);
        res.info := 'reservation was voided';
        RETURN res;
    END IF;

    UPDATE account SET reserved = reserved - r.amount, spent = spent + charge, updated_at = now()
     WHERE account_id = ANY (r.chain);
    UPDATE reservation
       SET state = 'settled', actual = p_actual, spent = charge, estimated = p_estimated,
           overrun = greatest(p_actual - r.amount, 0), resolved_at = now()
     WHERE reservation_id = p_reservation
    RETURNING * INTO r;
    INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, reservation_id, kind,
                              delta_reserved, delta_spent, actual, overrun, estimated, holder, note)
    SELECT r.tenant_id, r.run_id, l.task_id, r.account_id, r.chain, r.reservation_id, 'settle',
           -r.amount, charge, p_actual, r.overrun, p_estimated, r.holder,
           CASE WHEN p_actual > charge THEN format('%s tokens over every limit left unpaid', p_actual - charge) ELSE '' END
      FROM account l WHERE l.account_id = r.account_id;
    IF charge > r.amount THEN
        PERFORM ledger_check_exhausted(r.chain);
    END IF;
    IF run.closing THEN
        PERFORM ledger_resolved(r);
    END IF;
    res := ledger_result_of('ok', r);
    res.run_available := run.limit_tokens - (run.reserved - r.amount) - (run.spent + charge);
    RETURN res;
END $$;

CREATE OR REPLACE FUNCTION ledger_open_run(p_run text, p_tenant text, p_tenant_account bigint, p_limit bigint,
                                p_min bigint, p_task_ids text[], p_task_limits bigint[])
RETURNS SETOF account
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    parent_chain bigint[] := '{}';
    parent_tenant text;
    run_acct bigint;
    run_chain bigint[];
BEGIN
    IF p_run IS NULL OR p_run = '' OR p_tenant IS NULL OR p_tenant = '' OR p_limit IS NULL OR p_limit <= 0
       OR p_min IS NULL OR p_min <= 0 OR p_min > p_limit
       OR cardinality(p_task_ids) IS DISTINCT FROM cardinality(p_task_limits) THEN
        RAISE EXCEPTION 'ledger_open_run: run %, tenant %, limit %, min % out of range', p_run, p_tenant, p_limit, p_min
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT FROM account WHERE run_id = p_run AND kind = 'run') THEN
        IF p_tenant_account IS NOT NULL THEN
            SELECT chain, tenant_id INTO parent_chain, parent_tenant
              FROM account WHERE account_id = p_tenant_account AND kind = 'tenant';
            IF NOT FOUND THEN
                RAISE EXCEPTION 'tenant account % not found', p_tenant_account USING ERRCODE = 'foreign_key_violation';
            END IF;
            IF parent_tenant <> p_tenant THEN
                RAISE EXCEPTION 'tenant account % belongs to tenant %, not %', p_tenant_account, parent_tenant, p_tenant
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
        END IF;
        INSERT INTO tenant (tenant_id) VALUES (p_tenant) ON CONFLICT DO NOTHING;
        INSERT INTO account (tenant_id, parent_id, chain, kind, run_id, limit_tokens, min_reservation)
        VALUES (p_tenant, p_tenant_account, '{}', 'run', p_run, p_limit, p_min)
        RETURNING account_id INTO run_acct;
        run_chain := parent_chain || run_acct;
        UPDATE account SET chain = run_chain WHERE account_id = run_acct;
        INSERT INTO account (tenant_id, parent_id, chain, kind, run_id, task_id, limit_tokens)
        SELECT p_tenant, run_acct, '{}', 'task', p_run, t.task_id, t.limit_tokens
          FROM unnest(p_task_ids, p_task_limits) AS t(task_id, limit_tokens);
        UPDATE account SET chain = run_chain || account_id WHERE run_id = p_run AND kind = 'task';
        INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, kind, delta_limit)
        SELECT tenant_id, run_id, task_id, account_id, ARRAY[account_id], 'open', limit_tokens
          FROM account WHERE run_id = p_run ORDER BY account_id;
    END IF;
    RETURN QUERY SELECT * FROM account WHERE run_id = p_run ORDER BY (kind = 'task'), account_id;
END $$;

CREATE OR REPLACE FUNCTION ledger_open_tenant(p_tenant text, p_limit bigint) RETURNS SETOF account
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    id bigint;
BEGIN
    IF p_tenant IS NULL OR p_tenant = '' OR p_limit IS NULL OR p_limit <= 0 THEN
        RAISE EXCEPTION 'ledger_open_tenant: tenant % limit % out of range', p_tenant, p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO tenant (tenant_id) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    INSERT INTO account (tenant_id, chain, kind, limit_tokens)
    VALUES (p_tenant, '{}', 'tenant', p_limit)
    ON CONFLICT (tenant_id) WHERE kind = 'tenant' DO NOTHING
    RETURNING account_id INTO id;
    IF id IS NOT NULL THEN
        UPDATE account SET chain = ARRAY[account_id] WHERE account_id = id;
        INSERT INTO ledger_entry (tenant_id, account_id, chain, kind, delta_limit, note)
        VALUES (p_tenant, id, ARRAY[id], 'open', p_limit, 'tenant account');
    END IF;
    RETURN QUERY SELECT * FROM account WHERE tenant_id = p_tenant AND kind = 'tenant';
END $$;


DROP FUNCTION ledger_roll_period(account);
DROP FUNCTION ledger_exhaust_tenant(account);
DROP FUNCTION ledger_period_start(text, interval, timestamptz);
DROP FUNCTION ledger_period_next_end(text, interval, timestamptz, timestamptz);
DROP TABLE tenant_period;
DROP INDEX account_parent_open_run;
ALTER TABLE account DROP CONSTRAINT account_period;
ALTER TABLE account
    DROP COLUMN period_kind,
    DROP COLUMN period_every,
    DROP COLUMN period_limit,
    DROP COLUMN period_base,
    DROP COLUMN period_end;
ALTER TABLE ledger_entry DROP CONSTRAINT ledger_entry_kind_check;
ALTER TABLE ledger_entry ADD CONSTRAINT ledger_entry_kind_check CHECK (kind IN
    ('open', 'reserve', 'settle', 'void', 'expire', 'exhaust', 'cancel', 'close')) NOT VALID;
