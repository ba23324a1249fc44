-- ledger_reserve grants up to p_want tokens (at least p_min, else nothing)
-- to one call of the task or run account p_account, in one statement: the
-- only way a node gets tokens to spend (I1). It locks the account's chain
-- (task, run, and the tenant account if the run has one) in a fixed order,
-- rolls the tenant's budget period over when it has ended, and refuses
-- unless the account is open, belongs to run p_run of tenant p_tenant, and
-- p_attempt is the account's current dispatch (I9, I13). The grant is the
-- least that every account in the chain has available; it is held by a
-- reservation under a lease of p_ttl (at most an hour), which settle, void
-- or expiry resolves exactly once. A reserve with the key of an earlier one
-- returns that one's result and never grants twice (I4); a key whose
-- reservation is resolved is refused. A tenant already below its
-- min_reservation grants nothing to any run under it. When a grant leaves
-- an account below its min_reservation the account, or for a tenant every
-- open run under it, is marked exhausted and every node is notified
-- (ledger_check_exhausted, ledger_exhaust_tenant). p_model names what the
-- tokens pay for, so that an expired reservation can be priced. p_secret is
-- the attempt's (ledger_begin_attempt), which a worker's login must present
-- (ledger_secret_ok); the reservation keeps its hash, so that only the
-- holder of the secret settles, voids or renews it.
--
-- What a run holds back for its synthesis (account.held, here and on its
-- tenant's account) is available to no call, except one with p_from_held on
-- the run account itself: the synthesis's, which draws the grant from held
-- (also once the run is exhausted, never once it is cancelled or closed).
-- What such a reservation does not spend goes back to held (ledger_rehold).
--
-- On a sliced task account (docs/ledger.md#budget-slices) a call that
-- fits the slice locks the task's row alone; any other takes the chain's
-- locks and is paid by ledger_reserve_slice, which tops the slice up.
--
-- A grant says whether the task is wound down (wind_down,
-- ledger_wind_down): the call it pays for is then the task's last, made
-- without tools.
DROP FUNCTION IF EXISTS ledger_reserve(bigint,text,text,bigint,bigint,bigint,text,interval,text,text,text);
CREATE OR REPLACE FUNCTION ledger_reserve(p_account bigint, p_run text, p_tenant text, p_attempt bigint,
                               p_want bigint, p_min bigint, p_holder text, p_ttl interval, p_key text,
                               p_model text DEFAULT NULL, p_secret text DEFAULT NULL,
                               p_from_held boolean DEFAULT false)
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
    IF NOT ledger_reserve_args_ok(p_want, p_min, p_holder, p_attempt, p_ttl, p_model) THEN
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
    -- The secret, before any lock (a caller without it locks nothing), and
    -- again under the lock below (the attempt may have moved meanwhile).
    IF NOT ledger_secret_ok(leaf.secret_hash, p_secret) THEN
        RETURN ledger_refusal('denied', p_account,
            format('attempt %s was not dispatched with this secret', p_attempt));
    END IF;
    -- A call its task's slice pays for locks the task's row alone
    -- (docs/ledger.md#budget-slices). Checked again under that lock; a
    -- slice that no longer fits (another call or a recall took from it
    -- meanwhile) cannot take the chain's locks after the task's (root
    -- first: a top-up holding the run's row waits for the task's), so the
    -- call is refused to be retried, and the retry reads that it does not
    -- fit before it locks anything.
    IF NOT p_from_held AND ledger_slice_fits(leaf, 0, p_want) AND leaf.attempt = p_attempt
       AND (p_key IS NULL OR NOT EXISTS (SELECT FROM reservation WHERE account_id = p_account AND reserve_key = p_key)) THEN
        SELECT * INTO a FROM account WHERE account_id = p_account FOR UPDATE;
        -- The rest of this transaction takes no row above a slice's but
        -- without waiting (ledger_lock_accounts).
        PERFORM set_config('fanout.slice_locked', 'on', true);
        IF ledger_slice_fits(a, 0, p_want) AND a.attempt = p_attempt AND ledger_secret_ok(a.secret_hash, p_secret)
           AND (p_key IS NULL OR NOT EXISTS (SELECT FROM reservation WHERE account_id = p_account AND reserve_key = p_key)) THEN
            RETURN ledger_grant_slice(a, p_want, p_want, p_holder, p_ttl, p_key, p_attempt, p_model);
        END IF;
        RAISE EXCEPTION 'ledger_reserve: the slice of account % changed while it was locked; try again', p_account
            USING ERRCODE = 'serialization_failure';
    END IF;
    FOR a IN SELECT * FROM ledger_lock_chain(leaf.chain) LOOP
        IF a.kind = 'tenant' THEN
            -- Its period rolled over already if it had ended (the lock
            -- does it), so nothing is granted from an ended period.
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
    IF NOT ledger_secret_ok(leaf.secret_hash, p_secret) THEN
        RETURN ledger_refusal('denied', p_account,
            format('attempt %s was not dispatched with this secret', p_attempt));
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
                res := ledger_result_of('replay', r);
                res.wind_down := leaf.wind_down;
                RETURN res;
            END IF;
            -- The run was cancelled or closed meanwhile. The holder is asking
            -- again, so it never had the grant and never started a call on
            -- it: free it.
            PERFORM ledger_void(r.reservation_id, r.generation, 'reserve retried on an ended account', p_secret);
        END IF;
    END IF;
    IF ended.account_id IS NOT NULL
       AND NOT (p_from_held AND ended.account_id = leaf.account_id AND ended.state = 'exhausted') THEN
        IF ended.kind = 'run' AND ended.state = 'exhausted' AND ended.cause = 'tenant budget exhausted'
           AND tenant.account_id IS NOT NULL THEN
            -- What ran out is the tenant's budget: name that account.
            ended := tenant;
        END IF;
        res.outcome := 'exhausted';
        res.info_account := ended.account_id;
        res.info_kind := ended.kind;
        res.info_state := ended.state;
        res.info_available := ledger_available(ended);
        RETURN res;
    END IF;
    IF p_from_held THEN
        IF leaf.kind <> 'run' THEN
            RETURN ledger_refusal('denied', p_account, 'only a run account holds tokens for its synthesis');
        END IF;
        IF least(g, leaf.held) < p_min THEN
            res.outcome := 'exhausted';
            res.info_account := leaf.account_id;
            res.info_kind := leaf.kind;
            res.info_state := leaf.state;
            res.info_available := leaf.held;
            res.info := format('the run holds %s for its synthesis, less than the call''s minimum %s', leaf.held, p_min);
            RETURN res;
        END IF;
        g := least(g, leaf.held);
        -- The run's chain (its tenant's account, if any, and the run's)
        -- holds it: both move it from held to reserved.
        UPDATE account SET reserved = reserved + g, held = held - g, updated_at = now()
         WHERE account_id = ANY (leaf.chain);
        INSERT INTO reservation (tenant_id, run_id, account_id, chain, requested, amount, holder,
                                 lease_expires_at, reserve_key, attempt, model, secret_hash, from_held)
        VALUES (leaf.tenant_id, leaf.run_id, leaf.account_id, leaf.chain, p_want, g, p_holder,
                now() + p_ttl, p_key, p_attempt, nullif(p_model, ''), leaf.secret_hash, true)
        RETURNING * INTO r;
        INSERT INTO ledger_entry (tenant_id, run_id, account_id, chain, reservation_id,
                                  kind, delta_reserved, delta_held, holder, model, note)
        VALUES (leaf.tenant_id, leaf.run_id, leaf.account_id, leaf.chain,
                r.reservation_id, 'reserve', g, -g, p_holder, r.model, 'drawn on what the run holds for its synthesis');
        res := ledger_result_of('ok', r);
        res.run_available := ledger_available(leaf);
        RETURN res;
    END IF;
    IF leaf.cap_tokens IS NOT NULL THEN
        RETURN ledger_reserve_slice(leaf, run, tenant, p_want, p_min, p_holder, p_ttl, p_key, p_attempt, p_model);
    END IF;
    IF leaf.kind = 'run' AND ledger_available(leaf) < p_want
       AND EXISTS (SELECT FROM account WHERE parent_id = leaf.account_id AND kind = 'task' AND cap_tokens IS NOT NULL
                                      AND limit_tokens - reserved - spent > 0) THEN
        -- A call on the run's own account its pool cannot pay: what its
        -- tasks' slices do not use comes back first (docs/ledger.md#budget-slices).
        PERFORM ledger_recall(leaf.account_id, NULL);
        SELECT coalesce(array_agg(l ORDER BY l.chain), '{}') INTO locked FROM account l WHERE l.account_id = ANY (leaf.chain);
        SELECT * INTO leaf FROM account WHERE account_id = p_account;
        run := leaf;
        SELECT * INTO tenant FROM account WHERE account_id = leaf.chain[1] AND kind = 'tenant';
    END IF;
    -- The grant rule, root first (every account is open here).
    FOREACH a IN ARRAY locked LOOP
        IF ledger_grant_on(a, 0, g, p_min) IS NULL THEN
            -- A tenant below its own minimum grants nothing, whatever this
            -- call's minimum: it is exhausted for every run under it, also
            -- one opened after (admission refuses new runs; this holds
            -- without it).
            IF a.kind = 'tenant' AND ledger_below_minimum(a, 0) THEN
                PERFORM ledger_exhaust_tenant(a);
            END IF;
            res.outcome := 'exhausted';
            res.info_account := a.account_id;
            res.info_kind := a.kind;
            res.info_state := a.state;
            res.info_available := ledger_available(a);
            RETURN res;
        END IF;
        g := ledger_grant_on(a, 0, g, p_min);
    END LOOP;

    UPDATE account SET reserved = reserved + g, updated_at = now()
     WHERE account_id = ANY (leaf.chain);
    INSERT INTO reservation (tenant_id, run_id, account_id, chain, requested, amount, holder,
                             lease_expires_at, reserve_key, attempt, model, secret_hash)
    VALUES (leaf.tenant_id, leaf.run_id, leaf.account_id, leaf.chain, p_want, g, p_holder,
            now() + p_ttl, p_key, p_attempt, nullif(p_model, ''), leaf.secret_hash)
    RETURNING * INTO r;
    INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, reservation_id,
                              kind, delta_reserved, holder, model)
    VALUES (leaf.tenant_id, leaf.run_id, leaf.task_id, leaf.account_id, leaf.chain,
            r.reservation_id, 'reserve', g, p_holder, r.model);
    -- Only a grant that takes the run below its minimum ends it (saves a
    -- statement on the hot path).
    IF run.account_id IS NOT NULL AND ledger_below_minimum(run, g) THEN
        PERFORM ledger_check_exhausted(leaf.chain);
    END IF;
    IF tenant.account_id IS NOT NULL AND ledger_below_minimum(tenant, g) THEN
        tenant.reserved := tenant.reserved + g;
        PERFORM ledger_exhaust_tenant(tenant);
    END IF;
    res := ledger_result_of('ok', r);
    res.run_available := ledger_available(run) - g;
    res.wind_down := leaf.wind_down;
    RETURN res;
END $$;
REVOKE ALL ON FUNCTION ledger_reserve(bigint,text,text,bigint,bigint,bigint,text,interval,text,text,text,boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_reserve(bigint,text,text,bigint,bigint,bigint,text,interval,text,text,text,boolean) TO fanout_app, fanout_worker;
