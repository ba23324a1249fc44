-- Reverts 0019: no prices, no money views; ledger_reserve and
-- ledger_settle take their 0018 arguments again and entries no usage split.

SET LOCAL search_path = fanout, pg_catalog;

DROP VIEW tenant_spend_money_daily;
DROP VIEW task_spend_money;
DROP VIEW run_spend_money;
DROP VIEW money_line;
DROP FUNCTION price_set(text, text, timestamptz, numeric, numeric, text);
DROP TABLE price;
DROP VIEW audit_ledger_entry;
CREATE VIEW audit_ledger_entry AS
SELECT entry_id, tenant_id, run_id, task_id, account_id, reservation_id, kind, delta_limit,
       delta_reserved, delta_spent, actual, overrun, estimated, holder, note, created_at
  FROM ledger_entry;
GRANT SELECT ON audit_ledger_entry TO fanout_auditor, fanout_app;

DROP FUNCTION ledger_reserve(bigint, text, text, bigint, bigint, bigint, text, interval, text, text);
DROP FUNCTION ledger_settle(bigint, bigint, bigint, boolean, text, bigint, bigint);

CREATE FUNCTION ledger_reserve(p_account bigint, p_run text, p_tenant text, p_attempt bigint,
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
    tenant account;
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
        IF a.kind = 'tenant' THEN
            -- The period's end passed: this statement starts the next one,
            -- under the tenant's lock, before anything is granted from it.
            IF a.period_end IS NOT NULL AND now() >= a.period_end THEN
                a := ledger_roll_period(a);
            END IF;
            tenant := a;
        END IF;
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
        IF ended.kind = 'run' AND ended.state = 'exhausted' AND ended.cause = 'tenant budget exhausted'
           AND tenant.account_id IS NOT NULL THEN
            -- What ran out is the tenant's budget: name that account.
            ended := tenant;
        END IF;
        res.outcome := 'exhausted';
        res.info_account := ended.account_id;
        res.info_kind := ended.kind;
        res.info_state := ended.state;
        res.info_available := ended.limit_tokens - ended.reserved - ended.spent;
        RETURN res;
    END IF;
    FOREACH a IN ARRAY locked LOOP
        IF least(g, a.limit_tokens - a.reserved - a.spent) < p_min THEN
            IF a.kind = 'tenant' AND a.limit_tokens - a.reserved - a.spent < a.min_reservation THEN
                PERFORM ledger_exhaust_tenant(a);
            END IF;
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
    IF tenant.account_id IS NOT NULL
       AND tenant.limit_tokens - tenant.reserved - g - tenant.spent < tenant.min_reservation THEN
        tenant.reserved := tenant.reserved + g;
        PERFORM ledger_exhaust_tenant(tenant);
    END IF;
    res := ledger_result_of('ok', r);
    res.run_available := run.limit_tokens - run.reserved - g - run.spent;
    RETURN res;
END $$;

CREATE FUNCTION ledger_settle(p_reservation bigint, p_generation bigint, p_actual bigint,
                              p_estimated boolean)
RETURNS ledger_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    r      reservation;
    a      account;
    run    account;
    tenant account;
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
        IF a.kind = 'tenant' THEN
            -- Spend posted after the period's end counts in the next period.
            IF a.period_end IS NOT NULL AND now() >= a.period_end THEN
                a := ledger_roll_period(a);
            END IF;
            tenant := a;
        END IF;
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
        IF tenant.account_id IS NOT NULL
           AND tenant.limit_tokens - (tenant.reserved - r.amount) - (tenant.spent + charge) < tenant.min_reservation THEN
            tenant.reserved := tenant.reserved - r.amount;
            tenant.spent := tenant.spent + charge;
            PERFORM ledger_exhaust_tenant(tenant);
        END IF;
    END IF;
    IF run.closing THEN
        PERFORM ledger_resolved(r);
    END IF;
    res := ledger_result_of('ok', r);
    res.run_available := run.limit_tokens - (run.reserved - r.amount) - (run.spent + charge);
    RETURN res;
END $$;

CREATE OR REPLACE FUNCTION ledger_expire(p_reservation bigint) RETURNS ledger_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    r   reservation;
    res ledger_result;
BEGIN
    SELECT * INTO r FROM reservation WHERE reservation_id = p_reservation;
    IF NOT FOUND THEN
        res.outcome := 'not_found';
        RETURN res;
    END IF;
    PERFORM FROM ledger_lock_chain(r.chain);
    SELECT * INTO r FROM reservation WHERE reservation_id = p_reservation FOR UPDATE;
    IF r.state <> 'held' OR r.lease_expires_at > now() THEN
        RETURN ledger_result_of('replay', r);
    END IF;
    UPDATE account SET reserved = reserved - r.amount, spent = spent + r.amount, updated_at = now()
     WHERE account_id = ANY (r.chain);
    UPDATE reservation SET state = 'expired', spent = r.amount, estimated = true,
                           generation = generation + 1, resolved_at = now()
     WHERE reservation_id = p_reservation RETURNING * INTO r;
    INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, reservation_id, kind,
                              delta_reserved, delta_spent, estimated, holder, note)
    SELECT r.tenant_id, r.run_id, l.task_id, r.account_id, r.chain, r.reservation_id, 'expire',
           -r.amount, r.amount, true, r.holder, 'lease expired; full reservation counted as spent'
      FROM account l WHERE l.account_id = r.account_id;
    PERFORM ledger_resolved(r);
    RETURN ledger_result_of('ok', r);
END $$;


REVOKE ALL ON FUNCTION ledger_reserve(bigint, text, text, bigint, bigint, bigint, text, interval, text),
                       ledger_settle(bigint, bigint, bigint, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_reserve(bigint, text, text, bigint, bigint, bigint, text, interval, text),
                          ledger_settle(bigint, bigint, bigint, boolean) TO fanout_app;

ALTER TABLE ledger_entry DROP COLUMN model, DROP COLUMN input_tokens, DROP COLUMN output_tokens;
ALTER TABLE reservation DROP COLUMN model, DROP COLUMN input_tokens, DROP COLUMN output_tokens;
