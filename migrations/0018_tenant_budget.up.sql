-- Tenant budgets per period (issue 14).
--
-- A tenant account carries a period: none (its limit is all the tenant may
-- spend), day or month (boundaries at midnight UTC and on the 1st, in
-- database time), or every (a rolling period of a fixed length, at least
-- one second: for tests and operators). Its limit_tokens is always the
-- tenant's spend at the period's start (period_base) plus period_limit,
-- clamped: never below reserved + spent, so the account CHECK holds when a
-- budget is lowered under what is already spent and held (nothing more is
-- then granted this period; held reservations still settle). When now()
-- passes period_end, the first ledger statement that locks the tenant
-- account (a reserve, a settle, an open_run, a set-budget) posts one
-- 'period' entry that sets limit_tokens = spent + period_limit (clamped the
-- same way) and moves period_end to the next boundary after now(). Runs in
-- flight, whose chains point at the account, keep working across the
-- boundary; spend posted after the roll counts in the new period,
-- including the settle of a reservation held across it.
--
-- The tenant is exhausted when its available tokens fall below its own
-- min_reservation. The statement that leaves it there (a grant, a settle
-- with an overrun, a budget lowered) or that finds it there (a reserve
-- refused at the tenant account) marks every open run under it exhausted
-- with cause 'tenant budget exhausted', posts their 'exhaust' entries and
-- notifies 'exhausted <run_id>' for each, exactly as for a run's own
-- exhaustion. The tenant account itself stays open: the next period
-- grants again, to runs opened after it (an exhausted run never reopens).
--
-- tenant_period lists each tenant's periods; a period holds the spend
-- entries from its first_entry_id up to the next period's. Every entry
-- that moves a tenant's tokens is written under the tenant account's row
-- lock, so entry ids order those entries as the locks did.

SET LOCAL search_path = fanout, pg_catalog;

ALTER TABLE ledger_entry DROP CONSTRAINT ledger_entry_kind_check;
ALTER TABLE ledger_entry ADD CONSTRAINT ledger_entry_kind_check CHECK (kind IN
    ('open', 'reserve', 'settle', 'void', 'expire', 'exhaust', 'cancel', 'close', 'period', 'adjust'));

ALTER TABLE account
    ADD COLUMN period_kind  text NOT NULL DEFAULT 'none' CHECK (period_kind IN ('none', 'day', 'month', 'every')),
    ADD COLUMN period_every interval CHECK (period_every >= interval '1 second'),
    ADD COLUMN period_limit bigint CHECK (period_limit > 0),
    ADD COLUMN period_base  bigint NOT NULL DEFAULT 0 CHECK (period_base >= 0),
    ADD COLUMN period_end   timestamptz;
COMMENT ON COLUMN account.period_limit IS 'Tenant accounts: the tokens the tenant may spend per period (period none: in all).';
COMMENT ON COLUMN account.period_base IS 'Tenant accounts: spent at the current period''s start; limit_tokens = period_base + period_limit, clamped to reserved + spent.';
COMMENT ON COLUMN account.period_end IS 'Tenant accounts: when the current period ends (database time); NULL for period none.';

-- Tenant accounts opened before this migration: period none, their limit in all.
UPDATE account SET period_limit = limit_tokens WHERE kind = 'tenant';

ALTER TABLE account ADD CONSTRAINT account_period CHECK (
    (kind <> 'tenant' AND period_kind = 'none' AND period_limit IS NULL AND period_end IS NULL AND period_every IS NULL)
    OR (kind = 'tenant' AND period_limit IS NOT NULL
        AND (period_kind = 'none') = (period_end IS NULL)
        AND (period_kind = 'every') = (period_every IS NOT NULL)));

-- The open runs under a tenant account, for its exhaustion.
CREATE INDEX account_parent_open_run ON account (parent_id) WHERE kind = 'run' AND state = 'open';

CREATE TABLE tenant_period (
    account_id     bigint NOT NULL REFERENCES account (account_id),
    tenant_id      text NOT NULL,
    period_kind    text NOT NULL,
    period_start   timestamptz NOT NULL,
    period_end     timestamptz, -- NULL: period none
    first_entry_id bigint NOT NULL,
    PRIMARY KEY (account_id, first_entry_id)
);
INSERT INTO tenant_period (account_id, tenant_id, period_kind, period_start, period_end, first_entry_id)
SELECT a.account_id, a.tenant_id, 'none', a.created_at, NULL,
       coalesce((SELECT min(entry_id) FROM ledger_entry le WHERE le.account_id = a.account_id), 0)
  FROM account a WHERE a.kind = 'tenant';

-- ledger_period_next_end is the first boundary of a period of p_kind
-- (p_every for 'every') after p_at, counted from p_from (the last end, or
-- the start for a new 'every' period).
CREATE FUNCTION ledger_period_next_end(p_kind text, p_every interval, p_from timestamptz, p_at timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, fanout, pg_temp AS $$
    SELECT CASE p_kind
        WHEN 'day' THEN (date_trunc('day', p_at AT TIME ZONE 'UTC') + interval '1 day') AT TIME ZONE 'UTC'
        WHEN 'month' THEN (date_trunc('month', p_at AT TIME ZONE 'UTC') + interval '1 month') AT TIME ZONE 'UTC'
        WHEN 'every' THEN p_from + p_every * (floor(extract(epoch FROM p_at - p_from) / extract(epoch FROM p_every)) + 1)
    END
$$;

-- ledger_period_start is when the period that ends at p_end started.
CREATE FUNCTION ledger_period_start(p_kind text, p_every interval, p_end timestamptz)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, fanout, pg_temp AS $$
    SELECT CASE p_kind
        WHEN 'day' THEN ((p_end AT TIME ZONE 'UTC') - interval '1 day') AT TIME ZONE 'UTC'
        WHEN 'month' THEN ((p_end AT TIME ZONE 'UTC') - interval '1 month') AT TIME ZONE 'UTC'
        WHEN 'every' THEN p_end - p_every
    END
$$;

-- ledger_exhaust_tenant marks every open run under tenant account t
-- exhausted, posts their 'exhaust' entries and notifies each. Callers hold
-- t's row lock (so two statements never mark the same runs at once).
CREATE FUNCTION ledger_exhaust_tenant(t account) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    a account;
BEGIN
    FOR a IN UPDATE account SET state = 'exhausted', cause = 'tenant budget exhausted', updated_at = now()
              WHERE parent_id = t.account_id AND kind = 'run' AND state = 'open'
             RETURNING * LOOP
        INSERT INTO ledger_entry (tenant_id, run_id, account_id, chain, kind, note)
        VALUES (a.tenant_id, a.run_id, a.account_id, ARRAY[a.account_id], 'exhaust',
                format('tenant account %s: available %s < min_reservation %s',
                       t.account_id, t.limit_tokens - t.reserved - t.spent, t.min_reservation));
        PERFORM pg_notify('fanout_run_state', 'exhausted ' || a.run_id);
    END LOOP;
END $$;

-- ledger_roll_period starts tenant account t's next period if its end has
-- passed, and returns the account as it then is. Callers hold t's lock.
CREATE FUNCTION ledger_roll_period(t account) RETURNS account
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
    -- Clamped: what is held across the boundary stays within the limit.
    new_limit := greatest(t.spent + t.period_limit, t.spent + t.reserved);
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

-- ledger_set_tenant_budget creates the tenant and its account if missing,
-- or changes its budget under the account's lock (starting the next period
-- first if the current one ended); posts the change of limit as an entry
-- ('open' for a new account, 'adjust' otherwise) and logs the action.
-- A changed period kind (or length) starts a new period now; a changed
-- limit applies to the current one. p_min NULL keeps the tenant's
-- min_reservation (1 for a new account). Returns the account.
CREATE FUNCTION ledger_set_tenant_budget(p_actor text, p_tenant text, p_limit bigint, p_kind text,
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
            new_limit := greatest(t.spent + p_limit, t.spent + t.reserved);
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
            new_limit := greatest(t.period_base + p_limit, t.spent + t.reserved);
            INSERT INTO ledger_entry (tenant_id, account_id, chain, kind, delta_limit, note)
            VALUES (p_tenant, t.account_id, t.chain, 'adjust', new_limit - t.limit_tokens,
                    format('budget set to %s per %s%s by %s', p_limit, p_kind,
                           coalesce(' of ' || p_every::text, ''), p_actor));
            UPDATE account SET limit_tokens = new_limit, period_limit = p_limit,
                               min_reservation = coalesce(p_min, min_reservation), updated_at = now()
             WHERE account_id = t.account_id
            RETURNING * INTO t;
        END IF;
        IF t.limit_tokens - t.reserved - t.spent < t.min_reservation THEN
            PERFORM ledger_exhaust_tenant(t);
        END IF;
    END IF;
    PERFORM admin_log(p_actor, 'tenant.set_budget', p_tenant,
        jsonb_build_object('limit', p_limit, 'period', p_kind, 'every', p_every::text,
                           'min_reservation', t.min_reservation, 'account_id', t.account_id,
                           'limit_tokens', t.limit_tokens, 'created', fresh, 'prior', prior));
    RETURN QUERY SELECT * FROM account WHERE account_id = t.account_id;
END $$;

-- ledger_open_tenant creates (or returns) a tenant's account: period none,
-- p_limit in all. Not logged: it is the node's call; budgets set by an
-- operator go through ledger_set_tenant_budget.
CREATE OR REPLACE FUNCTION ledger_open_tenant(p_tenant text, p_limit bigint) RETURNS SETOF account
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    id bigint;
    e  bigint;
BEGIN
    IF p_tenant IS NULL OR p_tenant = '' OR p_limit IS NULL OR p_limit <= 0 THEN
        RAISE EXCEPTION 'ledger_open_tenant: tenant % limit % out of range', p_tenant, p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO tenant (tenant_id) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    INSERT INTO account (tenant_id, chain, kind, limit_tokens, period_limit)
    VALUES (p_tenant, '{}', 'tenant', p_limit, p_limit)
    ON CONFLICT (tenant_id) WHERE kind = 'tenant' DO NOTHING
    RETURNING account_id INTO id;
    IF id IS NOT NULL THEN
        UPDATE account SET chain = ARRAY[account_id] WHERE account_id = id;
        INSERT INTO ledger_entry (tenant_id, account_id, chain, kind, delta_limit, note)
        VALUES (p_tenant, id, ARRAY[id], 'open', p_limit, 'tenant account')
        RETURNING entry_id INTO e;
        INSERT INTO tenant_period (account_id, tenant_id, period_kind, period_start, period_end, first_entry_id)
        VALUES (id, p_tenant, 'none', now(), NULL, e);
    END IF;
    RETURN QUERY SELECT * FROM account WHERE tenant_id = p_tenant AND kind = 'tenant';
END $$;

-- ledger_reserve: 0005's, with the period roll and the tenant's exhaustion.
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

-- ledger_settle: 0005's, with the period roll and the tenant's exhaustion by an overrun.
CREATE OR REPLACE FUNCTION ledger_settle(p_reservation bigint, p_generation bigint, p_actual bigint,
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

-- ledger_open_run: 0005's; it locks the tenant account and rolls its period.
CREATE OR REPLACE FUNCTION ledger_open_run(p_run text, p_tenant text, p_tenant_account bigint, p_limit bigint,
                                p_min bigint, p_task_ids text[], p_task_limits bigint[])
RETURNS SETOF account
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    parent_chain bigint[] := '{}';
    parent_tenant text;
    run_acct bigint;
    run_chain bigint[];
    parent account;
BEGIN
    IF p_run IS NULL OR p_run = '' OR p_tenant IS NULL OR p_tenant = '' OR p_limit IS NULL OR p_limit <= 0
       OR p_min IS NULL OR p_min <= 0 OR p_min > p_limit
       OR cardinality(p_task_ids) IS DISTINCT FROM cardinality(p_task_limits) THEN
        RAISE EXCEPTION 'ledger_open_run: run %, tenant %, limit %, min % out of range', p_run, p_tenant, p_limit, p_min
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT FROM account WHERE run_id = p_run AND kind = 'run') THEN
        IF p_tenant_account IS NOT NULL THEN
            SELECT * INTO parent FROM account WHERE account_id = p_tenant_account AND kind = 'tenant' FOR UPDATE;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'tenant account % not found', p_tenant_account USING ERRCODE = 'foreign_key_violation';
            END IF;
            parent_chain := parent.chain;
            parent_tenant := parent.tenant_id;
            IF parent_tenant <> p_tenant THEN
                RAISE EXCEPTION 'tenant account % belongs to tenant %, not %', p_tenant_account, parent_tenant, p_tenant
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            IF parent.period_end IS NOT NULL AND now() >= parent.period_end THEN
                PERFORM ledger_roll_period(parent);
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

-- tenant_budget: each tenant account's budget as of now, as if the period
-- had rolled over when its end has passed (the roll itself waits for the
-- next statement that locks the account).
CREATE VIEW tenant_budget AS
SELECT a.tenant_id, a.account_id, a.period_kind, a.period_every, a.period_limit, a.min_reservation,
       a.reserved AS reserved_tokens, a.spent AS spent_tokens,
       CASE WHEN due THEN greatest(a.spent + a.period_limit, a.spent + a.reserved) ELSE a.limit_tokens END AS limit_tokens,
       CASE WHEN due THEN 0 ELSE a.spent - a.period_base END AS period_spent_tokens,
       CASE WHEN due THEN ledger_period_next_end(a.period_kind, a.period_every, a.period_end, now())
            ELSE a.period_end END AS period_end,
       a.state, a.created_at, a.updated_at
  FROM account a CROSS JOIN LATERAL (SELECT a.period_end IS NOT NULL AND now() >= a.period_end AS due) d
 WHERE a.kind = 'tenant';

-- tenant_period_spend: what each tenant spent in each of its periods,
-- reported and estimated, from the entries.
CREATE VIEW tenant_period_spend AS
SELECT p.tenant_id, p.account_id, p.period_kind, p.period_start, p.period_end,
       coalesce(sum(le.delta_spent), 0) AS spent_tokens,
       coalesce(sum(le.delta_spent) FILTER (WHERE NOT le.estimated), 0) AS reported_tokens,
       coalesce(sum(le.delta_spent) FILTER (WHERE le.estimated), 0) AS estimated_tokens,
       coalesce(sum(le.overrun), 0) AS overrun_tokens,
       count(DISTINCT le.run_id) AS runs
  FROM (SELECT tp.*, lead(tp.first_entry_id) OVER (PARTITION BY tp.account_id ORDER BY tp.first_entry_id) AS next_entry_id
          FROM tenant_period tp) p
  LEFT JOIN ledger_entry le
         ON le.tenant_id = p.tenant_id AND le.chain[1] = p.account_id AND le.kind IN ('settle', 'expire')
        AND le.entry_id >= p.first_entry_id AND (p.next_entry_id IS NULL OR le.entry_id < p.next_entry_id)
 GROUP BY p.tenant_id, p.account_id, p.period_kind, p.period_start, p.period_end, p.first_entry_id;

REVOKE ALL ON tenant_period FROM PUBLIC;
GRANT SELECT ON tenant_period TO fanout_app;
GRANT SELECT ON tenant_budget, tenant_period_spend TO fanout_auditor, fanout_app;
REVOKE ALL ON FUNCTION ledger_period_next_end(text, interval, timestamptz, timestamptz),
                       ledger_period_start(text, interval, timestamptz),
                       ledger_exhaust_tenant(account), ledger_roll_period(account),
                       ledger_set_tenant_budget(text, text, bigint, text, interval, bigint) FROM PUBLIC;
-- The views compute with it; it only does arithmetic on its arguments.
GRANT EXECUTE ON FUNCTION ledger_period_next_end(text, interval, timestamptz, timestamptz) TO fanout_app, fanout_auditor;
GRANT EXECUTE ON FUNCTION ledger_set_tenant_budget(text, text, bigint, text, interval, bigint) TO fanout_app;
