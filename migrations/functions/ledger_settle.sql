-- ledger_settle resolves a held reservation with the tokens the call used:
-- p_actual is posted as spent and the rest of the grant is freed on every
-- account of the chain. Usage beyond the grant is charged as far as every
-- account has room and recorded as overrun in full: never hidden, never
-- past a limit. It is idempotent for the same reservation and generation
-- (I3, I4) and refuses a stale generation (I9). p_estimated marks usage
-- the provider did not report (a cancelled call's full grant); p_model and
-- the provider's p_input/p_output split price it (money_line). It rolls
-- the tenant's period over when it has ended, and an overrun that leaves
-- the tenant below its minimum exhausts the tenant's runs. p_secret is the
-- secret of the attempt that reserved it (ledger_secret_ok). A call drawn
-- on a task's slice settles on the task's row alone (ledger_lock_reservation);
-- its usage past the grant tops the slice up from the run first
-- (docs/ledger.md#budget-slices).
CREATE OR REPLACE FUNCTION ledger_settle(p_reservation bigint, p_generation bigint, p_actual bigint,
                              p_estimated boolean, p_model text DEFAULT NULL,
                              p_input bigint DEFAULT 0, p_output bigint DEFAULT 0,
                              p_secret text DEFAULT NULL)
RETURNS ledger_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    r      reservation;
    a      account;
    run    account;
    tenant account;
    charge bigint := p_actual;
    res    ledger_result;
    rehold bigint;
    sliced boolean;
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
    IF NOT ledger_secret_ok(r.secret_hash, p_secret) THEN
        RETURN ledger_refusal('denied', r.account_id, 'the reservation was not granted to this secret');
    END IF;
    PERFORM FROM ledger_lock_reservation(r, p_actual > r.amount);
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
    -- The reservation is held and this settle resolves it: only now may a
    -- charge past its grant top its slice up.
    sliced := r.chain = ARRAY[r.account_id] AND EXISTS (SELECT FROM account WHERE account_id = r.account_id AND kind = 'task');
    IF sliced AND p_actual > r.amount THEN
        -- Usage past a grant drawn on a slice: the slice is topped up from
        -- the run (the chain is locked), as far as the cap and the run allow.
        SELECT * INTO a FROM account WHERE account_id = r.account_id;
        IF p_actual - r.amount > ledger_available(a) THEN
            PERFORM ledger_carve(a.account_id, p_actual - r.amount - ledger_available(a));
        END IF;
    END IF;
    FOR a IN SELECT * FROM account WHERE account_id = ANY (r.chain) ORDER BY chain LOOP
        IF a.kind = 'tenant' THEN
            -- Spend posted after the period's end counts in the next
            -- period: the lock rolled it over already.
            tenant := a;
        END IF;
        -- An overrun is paid from what is available: never from what a
        -- run holds for its synthesis.
        charge := least(charge, a.limit_tokens - (a.reserved - r.amount) - a.spent - a.held);
        IF a.kind = 'run' THEN
            run := a;
        END IF;
    END LOOP;

    UPDATE account SET reserved = reserved - r.amount, spent = spent + charge, updated_at = now()
     WHERE account_id = ANY (r.chain);
    -- What a synthesis call drawn on its run's allowance did not spend is
    -- held again, for its next call.
    rehold := ledger_rehold(r, r.amount - charge);
    -- Only a tenant whose limit was raised above its budget has anything
    -- to give back: no extra read on an ordinary settle.
    IF charge < r.amount AND tenant.limit_tokens > tenant.period_base + tenant.period_limit THEN
        PERFORM ledger_give_back(r.chain);
    END IF;
    UPDATE reservation
       SET state = 'settled', actual = p_actual, spent = charge, estimated = p_estimated,
           model = coalesce(nullif(p_model, ''), model),
           input_tokens = nullif(p_input + p_output, 0) - p_output, output_tokens = nullif(p_input + p_output, 0) - p_input,
           overrun = greatest(p_actual - r.amount, 0), resolved_at = now()
     WHERE reservation_id = p_reservation
    RETURNING * INTO r;
    INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, reservation_id, kind,
                              delta_reserved, delta_spent, delta_held, actual, overrun, estimated, holder,
                              model, input_tokens, output_tokens, note)
    SELECT r.tenant_id, r.run_id, l.task_id, r.account_id, r.chain, r.reservation_id, 'settle',
           -r.amount, charge, rehold, p_actual, r.overrun, p_estimated, r.holder,
           r.model, r.input_tokens, r.output_tokens,
           CASE WHEN p_actual > charge THEN format('%s tokens over every limit left unpaid', p_actual - charge) ELSE '' END
      FROM account l WHERE l.account_id = r.account_id;
    IF charge > r.amount AND sliced THEN
        PERFORM ledger_check_pool(r.account_id);
    ELSIF charge > r.amount THEN
        PERFORM ledger_check_exhausted(r.chain);
        IF tenant.account_id IS NOT NULL
           AND tenant.limit_tokens - (tenant.reserved - r.amount) - (tenant.spent + charge) - tenant.held < tenant.min_reservation THEN
            tenant.reserved := tenant.reserved - r.amount;
            tenant.spent := tenant.spent + charge;
            PERFORM ledger_exhaust_tenant(tenant);
        END IF;
    END IF;
    IF run.closing OR sliced THEN
        PERFORM ledger_resolved(r);
    END IF;
    res := ledger_result_of('ok', r);
    res.run_available := run.limit_tokens - (run.reserved - r.amount) - (run.spent + charge) - run.held - rehold;
    RETURN res;
END $$;
REVOKE ALL ON FUNCTION ledger_settle(bigint,bigint,bigint,boolean,text,bigint,bigint,text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_settle(bigint,bigint,bigint,boolean,text,bigint,bigint,text) TO fanout_app, fanout_worker;
