-- Spend in money as well as tokens (issue 14).
--
-- 1. The usage split. A reserve names the model it pays for (kept on the
--    reservation, so that an expired one can be priced); a settle carries
--    the provider's split of actual into input and output tokens (0 + 0
--    when the usage is estimated). Settle entries carry model and split,
--    expire entries the reservation's model. ledger_reserve and
--    ledger_settle get new signatures (the new arguments default, so a
--    caller of the old ones reaches the new).
-- 2. Prices: price (model, effective_from) -> per million input and output
--    tokens, written only by price_set, which logs to admin_action.
-- 3. Money views, each with tenant_id: money_line prices each spend entry
--    at the price in effect at its created_at; run_spend_money,
--    task_spend_money and tenant_spend_money_daily add them up, one row
--    per currency. A reported usage with its split is priced exactly
--    (input at the input price, output at the output price). Usage with
--    no split (estimated: a cancelled call, an expired lease; or a
--    provider that gave only a total) is priced at the higher of the two
--    prices: spend that cannot be proven cheaper is counted at the worst
--    case. Tokens of a model with no price in effect are counted in
--    unpriced_tokens (and in no cost); their rows have currency NULL.
--    Money counts the tokens used (actual; for an expiry, the amount
--    counted as spent); the token views count what was charged, which is
--    less only by an overrun left unpaid over every limit.

SET LOCAL search_path = fanout, pg_catalog;

ALTER TABLE reservation
    ADD COLUMN model         text CHECK (octet_length(model) <= 256),
    ADD COLUMN input_tokens  bigint CHECK (input_tokens >= 0),
    ADD COLUMN output_tokens bigint CHECK (output_tokens >= 0);
ALTER TABLE ledger_entry
    ADD COLUMN model         text,
    ADD COLUMN input_tokens  bigint CHECK (input_tokens >= 0),
    ADD COLUMN output_tokens bigint CHECK (output_tokens >= 0);

DROP FUNCTION ledger_reserve(bigint, text, text, bigint, bigint, bigint, text, interval, text);
DROP FUNCTION ledger_settle(bigint, bigint, bigint, boolean);

CREATE FUNCTION ledger_reserve(p_account bigint, p_run text, p_tenant text, p_attempt bigint,
                               p_want bigint, p_min bigint, p_holder text, p_ttl interval, p_key text,
                               p_model text DEFAULT NULL)
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
    IF octet_length(p_model) > 256 THEN
        RAISE EXCEPTION 'ledger_reserve: model name of % bytes is longer than 256', octet_length(p_model)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
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
                             lease_expires_at, reserve_key, attempt, model)
    VALUES (leaf.tenant_id, leaf.run_id, leaf.account_id, leaf.chain, p_want, g, p_holder,
            now() + p_ttl, p_key, p_attempt, nullif(p_model, ''))
    RETURNING * INTO r;
    INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, reservation_id,
                              kind, delta_reserved, holder, model)
    VALUES (leaf.tenant_id, leaf.run_id, leaf.task_id, leaf.account_id, leaf.chain,
            r.reservation_id, 'reserve', g, p_holder, r.model);
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
                              p_estimated boolean, p_model text DEFAULT NULL,
                              p_input bigint DEFAULT 0, p_output bigint DEFAULT 0)
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
    p_input := coalesce(p_input, 0);
    p_output := coalesce(p_output, 0);
    IF p_input < 0 OR p_output < 0 OR octet_length(p_model) > 256
       OR ((p_input <> 0 OR p_output <> 0) AND (p_estimated OR p_input + p_output <> p_actual)) THEN
        RAISE EXCEPTION 'ledger_settle: input % + output % must be 0 + 0 or add up to actual % of a reported (not estimated) usage; model at most 256 bytes',
            p_input, p_output, p_actual USING ERRCODE = 'invalid_parameter_value';
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
           model = coalesce(nullif(p_model, ''), model),
           input_tokens = nullif(p_input + p_output, 0) - p_output, output_tokens = nullif(p_input + p_output, 0) - p_input,
           overrun = greatest(p_actual - r.amount, 0), resolved_at = now()
     WHERE reservation_id = p_reservation
    RETURNING * INTO r;
    INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, reservation_id, kind,
                              delta_reserved, delta_spent, actual, overrun, estimated, holder,
                              model, input_tokens, output_tokens, note)
    SELECT r.tenant_id, r.run_id, l.task_id, r.account_id, r.chain, r.reservation_id, 'settle',
           -r.amount, charge, p_actual, r.overrun, p_estimated, r.holder,
           r.model, r.input_tokens, r.output_tokens,
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
                              delta_reserved, delta_spent, estimated, holder, model, note)
    SELECT r.tenant_id, r.run_id, l.task_id, r.account_id, r.chain, r.reservation_id, 'expire',
           -r.amount, r.amount, true, r.holder, r.model, 'lease expired; full reservation counted as spent'
      FROM account l WHERE l.account_id = r.account_id;
    PERFORM ledger_resolved(r);
    RETURN ledger_result_of('ok', r);
END $$;


REVOKE ALL ON FUNCTION ledger_reserve(bigint, text, text, bigint, bigint, bigint, text, interval, text, text),
                       ledger_settle(bigint, bigint, bigint, boolean, text, bigint, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_reserve(bigint, text, text, bigint, bigint, bigint, text, interval, text, text),
                          ledger_settle(bigint, bigint, bigint, boolean, text, bigint, bigint) TO fanout_app;

CREATE TABLE price (
    model              text NOT NULL CHECK (model <> '' AND octet_length(model) <= 256),
    effective_from     timestamptz NOT NULL,
    input_per_million  numeric NOT NULL CHECK (input_per_million >= 0),
    output_per_million numeric NOT NULL CHECK (output_per_million >= 0),
    currency           text NOT NULL DEFAULT 'USD' CHECK (currency ~ '^[A-Z]{3}$'),
    set_at             timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (model, effective_from)
);
COMMENT ON TABLE price IS 'Price per million tokens of a model from effective_from on, until the next row of the model. Written by price_set only.';

-- price_set sets the price of p_model from p_effective_from on (replacing
-- a price set for that same instant) and logs the action. Returns the row.
CREATE FUNCTION price_set(p_actor text, p_model text, p_effective_from timestamptz, p_in numeric, p_out numeric,
                          p_currency text DEFAULT 'USD')
RETURNS SETOF price
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    prior price;
BEGIN
    IF p_actor IS NULL OR p_actor = '' OR p_model IS NULL OR p_model = '' OR octet_length(p_model) > 256
       OR p_effective_from IS NULL OR p_in IS NULL OR p_in < 0 OR p_out IS NULL OR p_out < 0
       OR p_currency IS NULL OR p_currency !~ '^[A-Z]{3}$' THEN
        RAISE EXCEPTION 'price_set: actor %, model %, effective_from %, input % output % per million, currency % out of range (prices >= 0, currency 3 capital letters)',
            p_actor, p_model, p_effective_from, p_in, p_out, p_currency
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO prior FROM price WHERE model = p_model AND effective_from = p_effective_from FOR UPDATE;
    INSERT INTO price (model, effective_from, input_per_million, output_per_million, currency)
    VALUES (p_model, p_effective_from, p_in, p_out, p_currency)
    ON CONFLICT (model, effective_from) DO UPDATE
       SET input_per_million = excluded.input_per_million, output_per_million = excluded.output_per_million,
           currency = excluded.currency, set_at = now();
    PERFORM admin_log(p_actor, 'price.set', NULL,
        jsonb_build_object('model', p_model, 'effective_from', p_effective_from,
                           'input_per_million', p_in, 'output_per_million', p_out, 'currency', p_currency,
                           'replaced', CASE WHEN prior.model IS NULL THEN NULL ELSE to_jsonb(prior) END));
    RETURN QUERY SELECT * FROM price WHERE model = p_model AND effective_from = p_effective_from;
END $$;

-- money_line: each spend entry (settle, expire) priced at the price of its
-- model in effect at its created_at.
CREATE VIEW money_line AS
SELECT le.entry_id, le.tenant_id, le.run_id, le.task_id, le.kind, le.created_at, le.model,
       le.input_tokens, le.output_tokens, le.estimated,
       coalesce(le.actual, le.delta_spent) AS tokens,
       le.input_tokens IS NULL AS worst_case,
       p.effective_from AS price_from, p.currency,
       CASE WHEN p.model IS NULL THEN NULL
            WHEN le.input_tokens IS NOT NULL
                 THEN (le.input_tokens * p.input_per_million + le.output_tokens * p.output_per_million) / 1000000
            ELSE coalesce(le.actual, le.delta_spent) * greatest(p.input_per_million, p.output_per_million) / 1000000
       END AS cost
  FROM ledger_entry le
  LEFT JOIN LATERAL (SELECT * FROM price pr
                      WHERE pr.model = le.model AND pr.effective_from <= le.created_at
                      ORDER BY pr.effective_from DESC LIMIT 1) p ON true
 WHERE le.kind IN ('settle', 'expire');

CREATE VIEW run_spend_money AS
SELECT tenant_id, run_id, currency,
       coalesce(sum(cost), 0) AS cost,
       coalesce(sum(cost) FILTER (WHERE NOT worst_case), 0) AS reported_cost,
       coalesce(sum(cost) FILTER (WHERE worst_case), 0) AS worst_case_cost,
       coalesce(sum(tokens) FILTER (WHERE cost IS NOT NULL), 0) AS priced_tokens,
       coalesce(sum(tokens) FILTER (WHERE cost IS NOT NULL AND worst_case), 0) AS worst_case_tokens,
       coalesce(sum(tokens) FILTER (WHERE cost IS NULL), 0) AS unpriced_tokens
  FROM money_line
 GROUP BY tenant_id, run_id, currency;

CREATE VIEW task_spend_money AS
SELECT tenant_id, run_id, task_id, currency,
       coalesce(sum(cost), 0) AS cost,
       coalesce(sum(cost) FILTER (WHERE NOT worst_case), 0) AS reported_cost,
       coalesce(sum(cost) FILTER (WHERE worst_case), 0) AS worst_case_cost,
       coalesce(sum(tokens) FILTER (WHERE cost IS NOT NULL), 0) AS priced_tokens,
       coalesce(sum(tokens) FILTER (WHERE cost IS NOT NULL AND worst_case), 0) AS worst_case_tokens,
       coalesce(sum(tokens) FILTER (WHERE cost IS NULL), 0) AS unpriced_tokens
  FROM money_line
 WHERE task_id IS NOT NULL
 GROUP BY tenant_id, run_id, task_id, currency;

CREATE VIEW tenant_spend_money_daily AS
SELECT tenant_id, (created_at AT TIME ZONE 'UTC')::date AS day, currency,
       coalesce(sum(cost), 0) AS cost,
       coalesce(sum(cost) FILTER (WHERE NOT worst_case), 0) AS reported_cost,
       coalesce(sum(cost) FILTER (WHERE worst_case), 0) AS worst_case_cost,
       coalesce(sum(tokens) FILTER (WHERE cost IS NOT NULL), 0) AS priced_tokens,
       coalesce(sum(tokens) FILTER (WHERE cost IS NOT NULL AND worst_case), 0) AS worst_case_tokens,
       coalesce(sum(tokens) FILTER (WHERE cost IS NULL), 0) AS unpriced_tokens,
       count(DISTINCT run_id) AS runs
  FROM money_line
 GROUP BY tenant_id, (created_at AT TIME ZONE 'UTC')::date, currency;

-- audit_ledger_entry shows the split too.
CREATE OR REPLACE VIEW audit_ledger_entry AS
SELECT entry_id, tenant_id, run_id, task_id, account_id, reservation_id, kind, delta_limit,
       delta_reserved, delta_spent, actual, overrun, estimated, holder, note, created_at,
       model, input_tokens, output_tokens
  FROM ledger_entry;

REVOKE ALL ON price FROM PUBLIC;
REVOKE ALL ON FUNCTION price_set(text, text, timestamptz, numeric, numeric, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION price_set(text, text, timestamptz, numeric, numeric, text) TO fanout_app;
GRANT SELECT ON price, money_line, run_spend_money, task_spend_money, tenant_spend_money_daily
    TO fanout_auditor, fanout_app;
