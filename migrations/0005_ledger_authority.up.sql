-- The ledger holds against every caller (issue 9).
--
-- 1. Everything moves into the schema "fanout", where only the owner (the
--    role that runs migrations) can CREATE. Nodes connect with
--    search_path = fanout, public (store.Open sets it).
-- 2. The ledger functions are SECURITY DEFINER with a pinned search_path
--    (pg_catalog first, pg_temp last, so neither a planted function nor a
--    node's TEMP table can stand in for ours), EXECUTE revoked from PUBLIC
--    and granted to fanout_app. fanout_app keeps SELECT on the ledger tables
--    and loses every direct write: the functions are the only way to change
--    a balance.
-- 3. The database is the authority on who may spend: each dispatch bumps the
--    account's attempt (ledger_begin_attempt), and ledger_reserve refuses
--    anything but the current attempt on an open account of the named run
--    and tenant.
-- 4. A resolved reservation never grants again: a reserve whose key names a
--    reservation that is no longer held is refused.
-- 5. Nothing that may have been spent is refunded: ledger_end_run never
--    voids a held reservation; the run closes when the last one resolves.

CREATE SCHEMA fanout;
REVOKE ALL ON SCHEMA fanout FROM PUBLIC;
-- PostgreSQL 14 and older let PUBLIC create in public, where a planted
-- overload could be picked by an unqualified call in a later migration (run
-- as the owner). A no-op (with a warning) when the owner may not revoke it.
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA fanout TO fanout_app, fanout_auditor;

ALTER TABLE tenant SET SCHEMA fanout;
ALTER TABLE account SET SCHEMA fanout;
ALTER TABLE reservation SET SCHEMA fanout;
ALTER TABLE ledger_entry SET SCHEMA fanout;
ALTER TABLE run SET SCHEMA fanout;
ALTER TABLE task SET SCHEMA fanout;
ALTER TABLE run_event SET SCHEMA fanout;
ALTER TABLE rate_bucket SET SCHEMA fanout;
ALTER VIEW run_spend SET SCHEMA fanout;
ALTER VIEW task_spend SET SCHEMA fanout;
ALTER VIEW tenant_spend_daily SET SCHEMA fanout;
ALTER VIEW open_reservations SET SCHEMA fanout;
ALTER VIEW conservation_check SET SCHEMA fanout;
ALTER VIEW audit_ledger_entry SET SCHEMA fanout;
ALTER TYPE ledger_result SET SCHEMA fanout;
ALTER FUNCTION ledger_entry_append_only() SET SCHEMA fanout;
ALTER FUNCTION rate_capacity(bigint, interval) SET SCHEMA fanout;
ALTER FUNCTION rate_refill(double precision, bigint, interval, timestamptz, timestamptz) SET SCHEMA fanout;

-- The old functions are replaced below (new signatures, definer rights).
DROP FUNCTION ledger_reserve(bigint, bigint, bigint, text, interval, text);
DROP FUNCTION ledger_settle(bigint, bigint, bigint, boolean);
DROP FUNCTION ledger_void(bigint, bigint, text);
DROP FUNCTION ledger_renew(bigint, bigint, interval);
DROP FUNCTION ledger_expire(bigint);
DROP FUNCTION ledger_end_run(text, text, text);
DROP FUNCTION ledger_check_exhausted(bigint[]);
DROP FUNCTION ledger_lock_chain(bigint[]);
DROP FUNCTION ledger_result_of(text, reservation);

SET LOCAL search_path = fanout, pg_catalog;

-- attempt: the current dispatch of the task (or, on a run account, of its
-- synthesis call); only reserves naming it are granted. closing: the run's
-- close waits for its held reservations to resolve.
ALTER TABLE account
    ADD COLUMN attempt bigint NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    ADD COLUMN closing boolean NOT NULL DEFAULT false;
-- attempt: which dispatch of the task made the reservation (0: before this
-- column existed).
ALTER TABLE reservation ADD COLUMN attempt bigint NOT NULL DEFAULT 0;

ALTER FUNCTION ledger_entry_append_only() SET search_path = pg_catalog, fanout, pg_temp;

CREATE FUNCTION ledger_result_of(p_outcome text, r reservation) RETURNS ledger_result
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, fanout, pg_temp AS $$
    SELECT ROW(p_outcome, NULL, NULL, NULL, NULL, NULL,
               r.reservation_id, r.account_id, r.run_id, r.tenant_id, r.requested, r.amount,
               r.holder, r.generation, r.lease_expires_at, r.state, r.actual, r.spent,
               r.overrun, r.estimated, NULL)::ledger_result
$$;

-- ledger_refusal is a refusal outcome with its reason.
CREATE FUNCTION ledger_refusal(p_outcome text, p_account bigint, p_info text) RETURNS ledger_result
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    res ledger_result;
BEGIN
    res.outcome := p_outcome;
    res.info_account := p_account;
    res.info := p_info;
    RETURN res;
END $$;

-- ledger_check_exhausted marks the run in chain exhausted, once, when its
-- available tokens fall below its min_reservation, and notifies every node.
-- Callers hold the chain's row locks.
CREATE FUNCTION ledger_check_exhausted(p_chain bigint[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    a account;
BEGIN
    UPDATE account SET state = 'exhausted', cause = 'budget exhausted', updated_at = now()
     WHERE account_id = ANY (p_chain) AND kind = 'run' AND state = 'open'
       AND limit_tokens - reserved - spent < min_reservation
    RETURNING * INTO a;
    IF FOUND THEN
        INSERT INTO ledger_entry (tenant_id, run_id, account_id, chain, kind, note)
        VALUES (a.tenant_id, a.run_id, a.account_id, ARRAY[a.account_id], 'exhaust',
                format('available %s < min_reservation %s',
                       a.limit_tokens - a.reserved - a.spent, a.min_reservation));
        PERFORM pg_notify('fanout_run_state', 'exhausted ' || a.run_id);
    END IF;
END $$;

-- ledger_lock_chain locks the accounts of chain root first (the only order
-- anyone locks them in) and returns them in that order.
CREATE FUNCTION ledger_lock_chain(p_chain bigint[]) RETURNS SETOF account
LANGUAGE sql SET search_path = pg_catalog, fanout, pg_temp AS $$
    SELECT * FROM account WHERE account_id = ANY (p_chain)
     ORDER BY array_position(p_chain, account_id) FOR UPDATE
$$;

-- ledger_close_run closes a run account and its task accounts, once.
-- Callers hold the run's lock and know nothing is held in the run.
CREATE FUNCTION ledger_close_run(p_run_account bigint, p_note text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    a account;
BEGIN
    SELECT * INTO a FROM account WHERE account_id = p_run_account;
    IF a.state = 'closed' THEN
        RETURN;
    END IF;
    UPDATE account SET state = 'closed', closing = false,
                       cause = CASE WHEN state = 'open' THEN coalesce(p_note, '') ELSE cause END,
                       updated_at = now()
     WHERE run_id = a.run_id AND state <> 'closed';
    INSERT INTO ledger_entry (tenant_id, run_id, account_id, chain, kind, note)
    VALUES (a.tenant_id, a.run_id, a.account_id, ARRAY[a.account_id], 'close', coalesce(p_note, ''));
    PERFORM pg_notify('fanout_run_state', 'closed ' || a.run_id);
END $$;

-- ledger_resolved is called when reservation r left the held state: if its
-- run waits to close (closing) and holds nothing more, the run closes now.
-- Callers hold the chain's locks.
CREATE FUNCTION ledger_resolved(r reservation) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    run account;
BEGIN
    SELECT * INTO run FROM account
     WHERE account_id = ANY (r.chain) AND kind = 'run' AND closing;
    IF FOUND AND run.reserved = 0 THEN
        PERFORM ledger_close_run(run.account_id, 'run closed after its last held reservation resolved');
    END IF;
END $$;

-- ledger_begin_attempt records a new dispatch of an account's task (or of a
-- run's synthesis, on the run account) and returns its attempt number.
-- Earlier attempts can no longer reserve.
CREATE FUNCTION ledger_begin_attempt(p_account bigint, p_run text, p_tenant text)
RETURNS TABLE (outcome text, attempt bigint, info_kind text, info_state text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
#variable_conflict use_column
DECLARE
    a   account;
    run account;
BEGIN
    SELECT * INTO a FROM account WHERE account_id = p_account;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not_found', 0::bigint, NULL::text, NULL::text;
        RETURN;
    END IF;
    IF a.kind = 'tenant' OR a.run_id IS DISTINCT FROM p_run OR a.tenant_id IS DISTINCT FROM p_tenant THEN
        RETURN QUERY SELECT 'denied', 0::bigint, a.kind, NULL::text;
        RETURN;
    END IF;
    -- Root first, like every ledger function; the states are read under the
    -- locks, so a run ended meanwhile is seen.
    FOR run IN SELECT * FROM ledger_lock_chain(a.chain) LOOP
        IF run.account_id = a.account_id THEN
            a := run;
        END IF;
    END LOOP;
    SELECT * INTO run FROM account WHERE run_id = p_run AND kind = 'run';
    IF run.state <> 'open' OR a.state <> 'open' THEN
        RETURN QUERY SELECT 'exhausted', 0::bigint, CASE WHEN run.state <> 'open' THEN 'run' ELSE a.kind END,
                            CASE WHEN run.state <> 'open' THEN run.state ELSE a.state END;
        RETURN;
    END IF;
    UPDATE account SET attempt = account.attempt + 1, updated_at = now()
     WHERE account_id = p_account
    RETURNING account.attempt INTO a.attempt;
    RETURN QUERY SELECT 'ok', a.attempt, a.kind, 'open'::text;
END $$;

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

-- ledger_settle posts actual as spent and frees the rest. Usage beyond the
-- grant is charged as far as every account in the chain has room and recorded
-- as overrun in full: never hidden, never past a limit.
CREATE FUNCTION ledger_settle(p_reservation bigint, p_generation bigint, p_actual bigint,
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

CREATE FUNCTION ledger_void(p_reservation bigint, p_generation bigint, p_note text)
RETURNS ledger_result
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
    IF r.state = 'voided' THEN
        RETURN ledger_result_of('replay', r);
    ELSIF r.state = 'expired' OR (p_generation IS NOT NULL AND r.generation <> p_generation) THEN
        res := ledger_result_of('lease_lost', r);
        res.info := format('reservation is %s at generation %s; void came with generation %s', r.state, r.generation, p_generation);
        RETURN res;
    ELSIF r.state = 'settled' THEN
        res := ledger_result_of('conflict', r);
        res.info := 'reservation was already settled';
        RETURN res;
    END IF;
    UPDATE account SET reserved = reserved - r.amount, updated_at = now()
     WHERE account_id = ANY (r.chain);
    UPDATE reservation SET state = 'voided', resolved_at = now()
     WHERE reservation_id = p_reservation RETURNING * INTO r;
    INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, reservation_id, kind,
                              delta_reserved, holder, note)
    SELECT r.tenant_id, r.run_id, l.task_id, r.account_id, r.chain, r.reservation_id, 'void',
           -r.amount, r.holder, coalesce(p_note, '')
      FROM account l WHERE l.account_id = r.account_id;
    PERFORM ledger_resolved(r);
    RETURN ledger_result_of('ok', r);
END $$;

CREATE FUNCTION ledger_renew(p_reservation bigint, p_generation bigint, p_ttl interval)
RETURNS ledger_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    r   reservation;
    res ledger_result;
BEGIN
    IF p_ttl IS NULL OR p_ttl <= interval '0' OR p_ttl > interval '1 hour' THEN
        RAISE EXCEPTION 'ledger_renew: ttl % out of range (at most 1 hour)', p_ttl USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE reservation SET lease_expires_at = now() + p_ttl
     WHERE reservation_id = p_reservation AND state = 'held'
       AND generation = p_generation AND lease_expires_at > now()
    RETURNING * INTO r;
    IF FOUND THEN
        RETURN ledger_result_of('ok', r);
    END IF;
    SELECT * INTO r FROM reservation WHERE reservation_id = p_reservation;
    IF NOT FOUND THEN
        res.outcome := 'not_found';
        RETURN res;
    END IF;
    res := ledger_result_of('lease_lost', r);
    res.info := format('reservation is %s at generation %s, lease until %s', r.state, r.generation, r.lease_expires_at);
    RETURN res;
END $$;

-- ledger_expire posts one held reservation whose lease ran out (database time)
-- as spent at its full amount, flagged estimated: spend that cannot be proven
-- unspent is counted. Its generation moves on, fencing the old holder.
CREATE FUNCTION ledger_expire(p_reservation bigint) RETURNS ledger_result
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

-- ledger_end_run moves a run toward p_state (cancelled or closed) and
-- notifies. It never voids a held reservation (its call may have spent):
-- asked to close a run that still holds some, it cancels the run (nothing
-- more is granted) and marks it closing; the run closes when the last held
-- reservation is settled by its holder or expired by the sweeper. Returns
-- the run account.
CREATE FUNCTION ledger_end_run(p_run text, p_state text, p_cause text)
RETURNS SETOF account
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    a account;
BEGIN
    IF p_state IS NULL OR p_state NOT IN ('cancelled', 'closed') THEN
        RAISE EXCEPTION 'ledger_end_run: state % is not cancelled or closed', p_state
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO a FROM account WHERE run_id = p_run AND kind = 'run';
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- Lock the run first: a reservation granted after the held ones were
    -- counted would otherwise outlive the close.
    SELECT * INTO a FROM ledger_lock_chain(a.chain) l WHERE l.account_id = a.account_id;
    IF a.state = 'closed' THEN
        RETURN QUERY SELECT * FROM account WHERE account_id = a.account_id;
        RETURN;
    END IF;
    IF p_state = 'closed' AND a.reserved = 0 THEN
        PERFORM ledger_close_run(a.account_id, p_cause);
    ELSE
        IF p_state = 'closed' THEN
            p_cause := 'run ended with reservations still held; it closes when they resolve';
        END IF;
        IF a.state = 'open' THEN
            UPDATE account SET state = 'cancelled', cause = coalesce(p_cause, ''), updated_at = now()
             WHERE account_id = a.account_id;
            INSERT INTO ledger_entry (tenant_id, run_id, account_id, chain, kind, note)
            VALUES (a.tenant_id, p_run, a.account_id, ARRAY[a.account_id], 'cancel', coalesce(p_cause, ''));
            PERFORM pg_notify('fanout_run_state', 'cancelled ' || p_run);
        END IF;
        IF p_state = 'closed' THEN
            UPDATE account SET closing = true, updated_at = now() WHERE account_id = a.account_id;
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM account WHERE account_id = a.account_id;
END $$;

-- ledger_open_tenant creates (or returns) a tenant's account.
CREATE FUNCTION ledger_open_tenant(p_tenant text, p_limit bigint) RETURNS SETOF account
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

-- ledger_open_run creates a run's account (under p_tenant_account when not
-- NULL) and one account per task, or returns the existing ones: the run
-- account first, then its tasks. A tenant account of another tenant is
-- refused (SQLSTATE 22023, "belongs to tenant"); an unknown one is
-- foreign_key_violation.
CREATE FUNCTION ledger_open_run(p_run text, p_tenant text, p_tenant_account bigint, p_limit bigint,
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

-- Privileges. The owner keeps everything; PUBLIC gets nothing, now or for
-- functions created later; fanout_app executes the ledger's entry points
-- and reads what nodes read; fanout_auditor reads the audit views.
ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA fanout FROM PUBLIC, fanout_app, fanout_auditor;
GRANT EXECUTE ON FUNCTION
    ledger_begin_attempt(bigint, text, text),
    ledger_reserve(bigint, text, text, bigint, bigint, bigint, text, interval, text),
    ledger_settle(bigint, bigint, bigint, boolean),
    ledger_void(bigint, bigint, text),
    ledger_renew(bigint, bigint, interval),
    ledger_expire(bigint),
    ledger_end_run(text, text, text),
    ledger_open_tenant(text, bigint),
    ledger_open_run(text, text, bigint, bigint, bigint, text[], bigint[]),
    rate_capacity(bigint, interval),
    rate_refill(double precision, bigint, interval, timestamptz, timestamptz)
    TO fanout_app;

REVOKE ALL ON tenant, account, reservation, ledger_entry FROM fanout_app;
GRANT SELECT ON tenant, account, reservation, ledger_entry TO fanout_app;
