-- The token ledger: tenants, the account tree (tenant -> run -> task), reservations
-- with leases, and the append-only ledger_entry. Invariants live here, not in Go:
-- the CHECK on account makes overspend impossible whatever code path runs.

CREATE TABLE tenant (
    tenant_id  text PRIMARY KEY CHECK (tenant_id <> '' AND length(tenant_id) <= 128),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE account (
    account_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id       text NOT NULL REFERENCES tenant (tenant_id),
    parent_id       bigint REFERENCES account (account_id),
    -- chain lists the account's ancestors and itself, root first; it fixes the
    -- lock order (root first) so concurrent reservations never deadlock.
    chain           bigint[] NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('tenant', 'run', 'task')),
    run_id          text,
    task_id         text,
    limit_tokens    bigint NOT NULL CHECK (limit_tokens > 0),
    reserved        bigint NOT NULL DEFAULT 0,
    spent           bigint NOT NULL DEFAULT 0,
    min_reservation bigint NOT NULL DEFAULT 1 CHECK (min_reservation >= 1),
    state           text NOT NULL DEFAULT 'open'
                    CHECK (state IN ('open', 'exhausted', 'cancelled', 'closed')),
    cause           text NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT account_within_limit
        CHECK (reserved >= 0 AND spent >= 0 AND reserved + spent <= limit_tokens),
    CONSTRAINT account_kind_keys CHECK (
        (kind = 'tenant' AND run_id IS NULL AND task_id IS NULL) OR
        (kind = 'run' AND run_id IS NOT NULL AND task_id IS NULL) OR
        (kind = 'task' AND run_id IS NOT NULL AND task_id IS NOT NULL))
);
CREATE UNIQUE INDEX account_tenant_key ON account (tenant_id) WHERE kind = 'tenant';
CREATE UNIQUE INDEX account_run_key ON account (run_id) WHERE kind = 'run';
CREATE UNIQUE INDEX account_task_key ON account (run_id, task_id) WHERE kind = 'task';

CREATE TABLE reservation (
    reservation_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id        text NOT NULL REFERENCES tenant (tenant_id),
    run_id           text,
    account_id       bigint NOT NULL REFERENCES account (account_id),
    chain            bigint[] NOT NULL,
    requested        bigint NOT NULL CHECK (requested > 0),
    amount           bigint NOT NULL CHECK (amount > 0 AND amount <= requested),
    holder           text NOT NULL,
    generation       bigint NOT NULL DEFAULT 1,
    lease_expires_at timestamptz NOT NULL,
    state            text NOT NULL DEFAULT 'held'
                     CHECK (state IN ('held', 'settled', 'voided', 'expired')),
    actual           bigint CHECK (actual >= 0),
    spent            bigint NOT NULL DEFAULT 0 CHECK (spent >= 0),
    overrun          bigint NOT NULL DEFAULT 0 CHECK (overrun >= 0),
    estimated        boolean NOT NULL DEFAULT false,
    reserve_key      text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    resolved_at      timestamptz,
    CONSTRAINT reservation_resolved CHECK ((state = 'held') = (resolved_at IS NULL)),
    UNIQUE (account_id, reserve_key)
);
CREATE INDEX reservation_held_lease ON reservation (lease_expires_at) WHERE state = 'held';
CREATE INDEX reservation_run ON reservation (run_id, state);

-- ledger_entry is the append-only journal: one row per change, naming the leaf
-- account and carrying the whole chain it changed. For every account,
-- sum(delta_*) over entries whose chain holds it equals the account row.
CREATE TABLE ledger_entry (
    entry_id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id      text NOT NULL,
    run_id         text,
    task_id        text,
    account_id     bigint NOT NULL,
    chain          bigint[] NOT NULL,
    reservation_id bigint,
    kind           text NOT NULL CHECK (kind IN
                   ('open', 'reserve', 'settle', 'void', 'expire', 'exhaust', 'cancel', 'close')),
    delta_limit    bigint NOT NULL DEFAULT 0,
    delta_reserved bigint NOT NULL DEFAULT 0,
    delta_spent    bigint NOT NULL DEFAULT 0,
    actual         bigint,
    overrun        bigint NOT NULL DEFAULT 0,
    estimated      boolean NOT NULL DEFAULT false,
    holder         text,
    note           text NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ledger_entry_run ON ledger_entry (run_id);
CREATE INDEX ledger_entry_tenant_time ON ledger_entry (tenant_id, created_at);

CREATE FUNCTION ledger_entry_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger_entry is append-only: % refused; record a correction as a new entry', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER ledger_entry_no_update BEFORE UPDATE OR DELETE ON ledger_entry
    FOR EACH ROW EXECUTE FUNCTION ledger_entry_append_only();
CREATE TRIGGER ledger_entry_no_truncate BEFORE TRUNCATE ON ledger_entry
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_entry_append_only();

-- ledger_result is what every ledger function returns: an outcome word and the
-- reservation it concerns. Functions report refusals as outcomes instead of
-- raising, so many calls can share one transaction (group commit) without one
-- refusal aborting the rest.
CREATE TYPE ledger_result AS (
    outcome          text,   -- ok | replay | exhausted | not_found | conflict | lease_lost
    info_account     bigint, -- exhausted: the account that could not grant
    info_kind        text,
    info_state       text,
    info_available   bigint,
    info             text,   -- conflict: why
    reservation_id   bigint,
    account_id       bigint,
    run_id           text,
    tenant_id        text,
    requested        bigint,
    amount           bigint,
    holder           text,
    generation       bigint,
    lease_expires_at timestamptz,
    state            text,
    actual           bigint,
    spent            bigint,
    overrun          bigint,
    estimated        boolean,
    run_available    bigint  -- reserve, settle: the run's available tokens after the call
);

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

-- Audit: views an auditor reads, each carrying tenant_id.

CREATE VIEW run_spend AS
SELECT a.tenant_id, a.run_id, a.limit_tokens, a.reserved AS reserved_tokens, a.spent AS spent_tokens,
       a.limit_tokens - a.reserved - a.spent AS available_tokens, a.state, a.cause,
       coalesce(r.reported, 0) AS reported_tokens, coalesce(r.estimated, 0) AS estimated_tokens,
       coalesce(r.overrun, 0) AS overrun_tokens, coalesce(r.reservations, 0) AS reservations,
       a.created_at, a.updated_at
  FROM account a
  LEFT JOIN (SELECT run_id,
                    sum(spent) FILTER (WHERE NOT estimated) AS reported,
                    sum(spent) FILTER (WHERE estimated) AS estimated,
                    sum(overrun) AS overrun, count(*) AS reservations
               FROM reservation GROUP BY run_id) r USING (run_id)
 WHERE a.kind = 'run';

CREATE VIEW task_spend AS
SELECT a.tenant_id, a.run_id, a.task_id, a.limit_tokens, a.reserved AS reserved_tokens,
       a.spent AS spent_tokens, a.state,
       coalesce(r.reported, 0) AS reported_tokens, coalesce(r.estimated, 0) AS estimated_tokens,
       coalesce(r.overrun, 0) AS overrun_tokens, coalesce(r.calls, 0) AS reservations
  FROM account a
  LEFT JOIN (SELECT account_id,
                    sum(spent) FILTER (WHERE NOT estimated) AS reported,
                    sum(spent) FILTER (WHERE estimated) AS estimated,
                    sum(overrun) AS overrun, count(*) AS calls
               FROM reservation GROUP BY account_id) r USING (account_id)
 WHERE a.kind = 'task';

CREATE VIEW tenant_spend_daily AS
SELECT tenant_id, (created_at AT TIME ZONE 'UTC')::date AS day,
       sum(delta_spent) AS spent_tokens,
       sum(delta_spent) FILTER (WHERE NOT estimated) AS reported_tokens,
       coalesce(sum(delta_spent) FILTER (WHERE estimated), 0) AS estimated_tokens,
       sum(overrun) AS overrun_tokens,
       count(DISTINCT run_id) AS runs
  FROM ledger_entry
 WHERE kind IN ('settle', 'expire')
 GROUP BY tenant_id, (created_at AT TIME ZONE 'UTC')::date;

CREATE VIEW open_reservations AS
SELECT r.tenant_id, r.run_id, a.task_id, r.reservation_id, r.amount AS reserved_tokens,
       r.holder, r.generation, r.created_at, r.lease_expires_at,
       r.lease_expires_at <= now() AS lease_expired, now() - r.created_at AS age
  FROM reservation r JOIN account a USING (account_id)
 WHERE r.state = 'held';

CREATE VIEW conservation_check AS
SELECT a.tenant_id, a.run_id, a.task_id, a.account_id, a.kind, a.limit_tokens,
       a.limit_tokens - a.reserved - a.spent AS available_tokens,
       a.reserved AS reserved_tokens, a.spent AS spent_tokens,
       coalesce(e.limit_tokens, 0) AS entries_limit,
       coalesce(e.reserved, 0) AS entries_reserved,
       coalesce(e.spent, 0) AS entries_spent,
       a.limit_tokens = coalesce(e.limit_tokens, 0)
         AND a.reserved = coalesce(e.reserved, 0)
         AND a.spent = coalesce(e.spent, 0)
         AND a.reserved + a.spent <= a.limit_tokens
         AND a.reserved = coalesce(h.held, 0) AS conserved
  FROM account a
  LEFT JOIN (SELECT c.account_id, sum(le.delta_limit) AS limit_tokens,
                    sum(le.delta_reserved) AS reserved, sum(le.delta_spent) AS spent
               FROM ledger_entry le CROSS JOIN LATERAL unnest(le.chain) AS c(account_id)
              GROUP BY c.account_id) e USING (account_id)
  LEFT JOIN (SELECT c.account_id, sum(r.amount) AS held
               FROM reservation r CROSS JOIN LATERAL unnest(r.chain) AS c(account_id)
              WHERE r.state = 'held'
              GROUP BY c.account_id) h USING (account_id);

CREATE VIEW audit_ledger_entry AS
SELECT entry_id, tenant_id, run_id, task_id, account_id, reservation_id, kind, delta_limit,
       delta_reserved, delta_spent, actual, overrun, estimated, holder, note, created_at
  FROM ledger_entry;

-- Roles. fanout_auditor reads the views and nothing else; fanout_app is what
-- a node needs. Roles are cluster-wide, so create them only when missing.
DO $$
BEGIN
    CREATE ROLE fanout_auditor NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END $$;
DO $$
BEGIN
    CREATE ROLE fanout_app NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END $$;

REVOKE ALL ON ALL TABLES IN SCHEMA public FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO fanout_auditor, fanout_app;
GRANT SELECT ON run_spend, task_spend, tenant_spend_daily, open_reservations,
                conservation_check, audit_ledger_entry TO fanout_auditor;

GRANT SELECT, INSERT ON tenant TO fanout_app;
GRANT SELECT, INSERT, UPDATE ON account, reservation TO fanout_app;
GRANT SELECT, INSERT ON ledger_entry TO fanout_app;
REVOKE UPDATE, DELETE, TRUNCATE ON ledger_entry FROM fanout_app, fanout_auditor;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO fanout_app;
GRANT SELECT ON run_spend, task_spend, tenant_spend_daily, open_reservations,
                conservation_check, audit_ledger_entry TO fanout_app;
