-- Reverts 0005: the ledger back in public with the functions of 0001 and
-- the direct grants of 0001; attempts, closing and the open functions go.

DROP FUNCTION fanout.ledger_open_run(text, text, bigint, bigint, bigint, text[], bigint[]);
DROP FUNCTION fanout.ledger_open_tenant(text, bigint);
DROP FUNCTION fanout.ledger_end_run(text, text, text);
DROP FUNCTION fanout.ledger_expire(bigint);
DROP FUNCTION fanout.ledger_renew(bigint, bigint, interval);
DROP FUNCTION fanout.ledger_void(bigint, bigint, text);
DROP FUNCTION fanout.ledger_settle(bigint, bigint, bigint, boolean);
DROP FUNCTION fanout.ledger_reserve(bigint, text, text, bigint, bigint, bigint, text, interval, text);
DROP FUNCTION fanout.ledger_begin_attempt(bigint, text, text);
DROP FUNCTION fanout.ledger_resolved(fanout.reservation);
DROP FUNCTION fanout.ledger_close_run(bigint, text);
DROP FUNCTION fanout.ledger_lock_chain(bigint[]);
DROP FUNCTION fanout.ledger_check_exhausted(bigint[]);
DROP FUNCTION fanout.ledger_refusal(text, bigint, text);
DROP FUNCTION fanout.ledger_result_of(text, fanout.reservation);

ALTER TABLE fanout.reservation DROP COLUMN attempt;
ALTER TABLE fanout.account DROP COLUMN attempt, DROP COLUMN closing;
ALTER FUNCTION fanout.ledger_entry_append_only() RESET search_path;
ALTER DEFAULT PRIVILEGES GRANT EXECUTE ON FUNCTIONS TO PUBLIC;

ALTER TABLE fanout.tenant SET SCHEMA public;
ALTER TABLE fanout.account SET SCHEMA public;
ALTER TABLE fanout.reservation SET SCHEMA public;
ALTER TABLE fanout.ledger_entry SET SCHEMA public;
ALTER TABLE fanout.run SET SCHEMA public;
ALTER TABLE fanout.task SET SCHEMA public;
ALTER TABLE fanout.run_event SET SCHEMA public;
ALTER TABLE fanout.rate_bucket SET SCHEMA public;
ALTER VIEW fanout.run_spend SET SCHEMA public;
ALTER VIEW fanout.task_spend SET SCHEMA public;
ALTER VIEW fanout.tenant_spend_daily SET SCHEMA public;
ALTER VIEW fanout.open_reservations SET SCHEMA public;
ALTER VIEW fanout.conservation_check SET SCHEMA public;
ALTER VIEW fanout.audit_ledger_entry SET SCHEMA public;
ALTER TYPE fanout.ledger_result SET SCHEMA public;
ALTER FUNCTION fanout.ledger_entry_append_only() SET SCHEMA public;
ALTER FUNCTION fanout.rate_capacity(bigint, interval) SET SCHEMA public;
ALTER FUNCTION fanout.rate_refill(double precision, bigint, interval, timestamptz, timestamptz) SET SCHEMA public;
DROP SCHEMA fanout;

SET LOCAL search_path = public, pg_catalog;

CREATE FUNCTION ledger_result_of(p_outcome text, r reservation) RETURNS ledger_result
LANGUAGE sql IMMUTABLE AS $$
    SELECT ROW(p_outcome, NULL, NULL, NULL, NULL, NULL,
               r.reservation_id, r.account_id, r.run_id, r.tenant_id, r.requested, r.amount,
               r.holder, r.generation, r.lease_expires_at, r.state, r.actual, r.spent,
               r.overrun, r.estimated, NULL)::ledger_result
$$;

-- ledger_check_exhausted marks the run in chain exhausted, once, when its
-- available tokens fall below its min_reservation, and notifies every node.
-- Callers hold the chain's row locks.
CREATE FUNCTION ledger_check_exhausted(p_chain bigint[]) RETURNS void LANGUAGE plpgsql AS $$
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
CREATE FUNCTION ledger_lock_chain(p_chain bigint[]) RETURNS SETOF account LANGUAGE sql AS $$
    SELECT * FROM account WHERE account_id = ANY (p_chain)
     ORDER BY array_position(p_chain, account_id) FOR UPDATE
$$;

CREATE FUNCTION ledger_reserve(p_account bigint, p_want bigint, p_min bigint,
                               p_holder text, p_ttl interval, p_key text)
RETURNS ledger_result LANGUAGE plpgsql AS $$
DECLARE
    leaf  account;
    a     account;
    r     reservation;
    g     bigint := p_want;
    res   ledger_result;
    run   account;
BEGIN
    SELECT * INTO leaf FROM account WHERE account_id = p_account;
    IF NOT FOUND THEN
        res.outcome := 'not_found';
        RETURN res;
    END IF;
    FOR a IN SELECT * FROM ledger_lock_chain(leaf.chain) LOOP
        IF a.state <> 'open' OR least(g, a.limit_tokens - a.reserved - a.spent) < p_min THEN
            -- A retry of a granted call must still get its reservation back.
            IF p_key IS NOT NULL THEN
                SELECT * INTO r FROM reservation WHERE account_id = p_account AND reserve_key = p_key;
                IF FOUND THEN RETURN ledger_result_of('replay', r); END IF;
            END IF;
            res.outcome := 'exhausted';
            res.info_account := a.account_id;
            res.info_kind := a.kind;
            res.info_state := a.state;
            res.info_available := a.limit_tokens - a.reserved - a.spent;
            RETURN res;
        END IF;
        g := least(g, a.limit_tokens - a.reserved - a.spent);
        IF a.kind = 'run' THEN
            run := a;
        END IF;
    END LOOP;
    IF p_key IS NOT NULL THEN
        -- Checked under the chain lock, so a concurrent duplicate has committed.
        SELECT * INTO r FROM reservation WHERE account_id = p_account AND reserve_key = p_key;
        IF FOUND THEN RETURN ledger_result_of('replay', r); END IF;
    END IF;

    UPDATE account SET reserved = reserved + g, updated_at = now()
     WHERE account_id = ANY (leaf.chain);
    INSERT INTO reservation (tenant_id, run_id, account_id, chain, requested, amount, holder,
                             lease_expires_at, reserve_key)
    VALUES (leaf.tenant_id, leaf.run_id, leaf.account_id, leaf.chain, p_want, g, p_holder,
            now() + p_ttl, p_key)
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
RETURNS ledger_result LANGUAGE plpgsql AS $$
DECLARE
    r      reservation;
    a      account;
    run    account;
    charge bigint := p_actual;
    res    ledger_result;
BEGIN
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
    ELSIF r.state = 'expired' OR r.generation <> p_generation THEN
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
    res := ledger_result_of('ok', r);
    res.run_available := run.limit_tokens - (run.reserved - r.amount) - (run.spent + charge);
    RETURN res;
END $$;

CREATE FUNCTION ledger_void(p_reservation bigint, p_generation bigint, p_note text)
RETURNS ledger_result LANGUAGE plpgsql AS $$
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
    RETURN ledger_result_of('ok', r);
END $$;

CREATE FUNCTION ledger_renew(p_reservation bigint, p_generation bigint, p_ttl interval)
RETURNS ledger_result LANGUAGE plpgsql AS $$
DECLARE
    r   reservation;
    res ledger_result;
BEGIN
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
CREATE FUNCTION ledger_expire(p_reservation bigint) RETURNS ledger_result LANGUAGE plpgsql AS $$
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
    RETURN ledger_result_of('ok', r);
END $$;

-- ledger_end_run moves an open run to p_state (cancelled or closed) and
-- notifies. With p_state = 'closed' it first voids what the run still holds
-- and closes its task accounts too. Returns the run account.
CREATE FUNCTION ledger_end_run(p_run text, p_state text, p_cause text)
RETURNS SETOF account LANGUAGE plpgsql AS $$
DECLARE
    a     account;
    r_id  bigint;
    prior text;
BEGIN
    SELECT * INTO a FROM account WHERE run_id = p_run AND kind = 'run';
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- Lock the run first: a reservation granted after the list of held ones
    -- was read would otherwise outlive the close.
    PERFORM FROM ledger_lock_chain(a.chain);
    IF p_state = 'closed' THEN
        FOR r_id IN SELECT reservation_id FROM reservation
                     WHERE run_id = p_run AND state = 'held' ORDER BY reservation_id LOOP
            PERFORM ledger_void(r_id, NULL, 'run closed');
        END LOOP;
    END IF;
    SELECT state INTO prior FROM account WHERE account_id = a.account_id;
    IF prior = 'closed' OR (p_state = 'cancelled' AND prior <> 'open') THEN
        RETURN QUERY SELECT * FROM account WHERE account_id = a.account_id;
        RETURN;
    END IF;
    UPDATE account SET state = p_state,
                       cause = CASE WHEN state = 'open' THEN p_cause ELSE cause END,
                       updated_at = now()
     WHERE run_id = p_run AND (kind = 'run' OR p_state = 'closed') AND state <> 'closed';
    INSERT INTO ledger_entry (tenant_id, run_id, account_id, chain, kind, note)
    VALUES (a.tenant_id, p_run, a.account_id, ARRAY[a.account_id],
            CASE p_state WHEN 'closed' THEN 'close' ELSE 'cancel' END, coalesce(p_cause, ''));
    PERFORM pg_notify('fanout_run_state', p_state || ' ' || p_run);
    RETURN QUERY SELECT * FROM account WHERE account_id = a.account_id;
END $$;

-- As 0001 left them: nothing executable by PUBLIC but the rate functions.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rate_capacity(bigint, interval),
    rate_refill(double precision, bigint, interval, timestamptz, timestamptz) TO PUBLIC;
GRANT SELECT, INSERT, UPDATE ON account, reservation TO fanout_app;
GRANT SELECT, INSERT ON ledger_entry TO fanout_app;
GRANT SELECT, INSERT ON tenant TO fanout_app;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO fanout_app;
