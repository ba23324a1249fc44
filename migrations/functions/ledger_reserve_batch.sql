-- ledger_reserve_batch makes n reserves in one statement: call i is
-- ledger_reserve(p_accounts[i], p_runs[i], p_tenants[i], p_attempts[i],
-- p_wants[i], p_mins[i], p_holders[i], p_ttls[i], p_keys[i], p_models[i],
-- p_secrets[i], p_from_held[i]), and row i of the result is what that call
-- returns when the n calls are made one after another, in the order given,
-- in the caller's transaction. It is how a group commit batch of reserves
-- (store's batchExec) is written, and it is there for speed only: it grants
-- nothing ledger_reserve would not.
--
-- The accounts of every call's chain are locked once, in the one order
-- (by chain: tree preorder, root first), with a tenant's period rolled over
-- under its lock as ledger_lock_chain does. A call that needs nothing but
-- the grant rule (its parameters are in range, its account is a task's or
-- a run's of the run and tenant it names, its attempt and secret are the
-- account's current ones, its key is new, every account of its chain is
-- open, it does not draw on what the run holds, and the grant leaves the
-- run and the tenant at or above their min_reservation) is granted from
-- the locked rows and what the calls before it were granted; the grants are
-- written together: one INSERT of reservations, one of ledger entries, one
-- UPDATE of the accounts. Any other call (a replay, a refusal, a grant that
-- exhausts, a draw on what the run holds, bad input) is made by
-- ledger_reserve itself, after the grants before it are written, so that it
-- sees the ledger as the calls before it left it.
--
-- A call on a sliced task account that its slice pays for whole locks the
-- task's row only and is granted from it (docs/ledger.md#budget-slices):
-- a batch of such calls touches no run or tenant row. Any other call on a
-- slice is ledger_reserve's, under its chain's locks.
CREATE OR REPLACE FUNCTION ledger_reserve_batch(p_accounts bigint[], p_runs text[], p_tenants text[], p_attempts bigint[],
                                     p_wants bigint[], p_mins bigint[], p_holders text[], p_ttls interval[],
                                     p_keys text[], p_models text[], p_secrets text[], p_from_held boolean[])
RETURNS SETOF ledger_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    n       int := coalesce(cardinality(p_accounts), 0);
    orch    boolean := session_is_orchestrator();
    ids     bigint[] := '{}';   -- the locked accounts, by chain
    acc     account[] := '{}';  -- their rows as locked, or as the last ledger_reserve left them
    delta   bigint[];           -- what the grants not yet written add to each one's reserved
    seen    text[];             -- 'account key' of every reservation the calls' keys name
    results ledger_result[];
    pend    int[] := '{}';      -- the calls granted here and not yet written
    grants  bigint[] := '{}';
    avails  bigint[] := '{}';
    winds   boolean[] := '{}';
    slc     boolean[] := '{}';  -- whether each granted call is drawn on its task's slice
    onslice boolean[];          -- whether each call's slice pays for it, before any lock
    want    bigint[];
    leaf    account;
    a       account;
    r       reservation;
    res     ledger_result;
    fast    boolean;
    g       bigint;
    run_avail bigint;
    c       bigint;
    i       int;
    j       int;
    k       int;
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;
    IF coalesce(cardinality(p_runs), -1) <> n OR coalesce(cardinality(p_tenants), -1) <> n
       OR coalesce(cardinality(p_attempts), -1) <> n OR coalesce(cardinality(p_wants), -1) <> n
       OR coalesce(cardinality(p_mins), -1) <> n OR coalesce(cardinality(p_holders), -1) <> n
       OR coalesce(cardinality(p_ttls), -1) <> n OR coalesce(cardinality(p_keys), -1) <> n
       OR coalesce(cardinality(p_models), -1) <> n OR coalesce(cardinality(p_secrets), -1) <> n
       OR coalesce(cardinality(p_from_held), -1) <> n THEN
        RAISE EXCEPTION 'ledger_reserve_batch: every argument must have one element per call (% calls)', n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The calls their tasks' slices pay for, by what the slices say before
    -- any lock: those lock the task's row alone (docs/ledger.md#budget-slices).
    onslice := array_fill(false, ARRAY[n]);
    FOR i IN 1..n LOOP
        SELECT * INTO leaf FROM account WHERE account_id = p_accounts[i];
        IF FOUND AND NOT coalesce(p_from_held[i], true) AND leaf.cap_tokens IS NOT NULL THEN
            g := 0;
            FOR j IN 1..i - 1 LOOP
                IF onslice[j] AND p_accounts[j] = p_accounts[i] THEN
                    g := g + p_wants[j];
                END IF;
            END LOOP;
            onslice[i] := ledger_slice_fits(leaf, g, coalesce(p_wants[i], 0)) AND p_wants[i] > 0;
        END IF;
    END LOOP;
    SELECT coalesce(array_agg(DISTINCT x), '{}') INTO want
      FROM (SELECT x FROM account l JOIN unnest(p_accounts, onslice) AS u(id, s) ON l.account_id = u.id AND NOT u.s,
                          unnest(l.chain) AS x
            UNION
            SELECT u.id FROM unnest(p_accounts, onslice) AS u(id, s) WHERE u.s) AS w;
    FOR a IN SELECT * FROM ledger_lock_accounts(want) LOOP
        ids := ids || a.account_id;
        acc := acc || a;
    END LOOP;
    IF true = ANY (onslice) THEN
        -- Slices' rows are held without the rows above them: the rest of
        -- this transaction takes those without waiting (ledger_lock_accounts).
        PERFORM set_config('fanout.slice_locked', 'on', true);
    END IF;
    -- As ledger_lock_chain: a run put under its tenant's budget after the
    -- chains were read has a longer chain now.
    IF EXISTS (SELECT FROM account l JOIN unnest(p_accounts, onslice) AS u(id, s) ON l.account_id = u.id AND NOT u.s,
                           unnest(l.chain) AS x
                WHERE x <> ALL (ids)) THEN
        RAISE EXCEPTION 'ledger_reserve_batch: a chain changed while it was locked (its run was put under a tenant budget); try again'
            USING ERRCODE = 'serialization_failure';
    END IF;
    delta := array_fill(0::bigint, ARRAY[cardinality(ids)]);
    results := array_fill(NULL::ledger_result, ARRAY[n]);
    -- Checked under the locks, as ledger_reserve does.
    SELECT coalesce(array_agg(v.account_id::text || ' ' || v.reserve_key), '{}') INTO seen
      FROM reservation v JOIN unnest(p_accounts, p_keys) AS u(account_id, reserve_key)
        ON v.account_id = u.account_id AND v.reserve_key = u.reserve_key;

    -- One turn more than there are calls: the last writes what is granted.
    FOR i IN 1..n + 1 LOOP
        fast := false;
        IF i <= n THEN
            g := p_wants[i];
            run_avail := NULL;
            k := array_position(ids, p_accounts[i]);
            fast := coalesce(k IS NOT NULL AND p_keys[i] IS NOT NULL AND NOT p_from_held[i]
                             AND ledger_reserve_args_ok(p_wants[i], p_mins[i], p_holders[i], p_attempts[i], p_ttls[i], p_models[i])
                             AND (p_accounts[i]::text || ' ' || p_keys[i]) <> ALL (seen), false);
            IF fast THEN
                leaf := acc[k];
                fast := coalesce(leaf.kind <> 'tenant' AND leaf.run_id = p_runs[i] AND leaf.tenant_id = p_tenants[i]
                                 AND leaf.attempt = p_attempts[i]
                                 AND (orch OR leaf.secret_hash = sha256(convert_to(p_secrets[i], 'UTF8'))), false);
            END IF;
            IF fast AND leaf.cap_tokens IS NOT NULL THEN
                -- On a slice: granted whole from it, or made by
                -- ledger_reserve (which tops the slice up).
                IF onslice[i] AND NOT ledger_slice_fits(leaf, delta[k], p_wants[i])
                   AND NOT leaf.chain[1] = ANY (ids) THEN
                    -- Its slice no longer pays for it (a call or a recall
                    -- took from it since it was read): the chain's locks
                    -- cannot be taken after the task's (root first), so the
                    -- batch is refused to be retried, reading that first.
                    RAISE EXCEPTION 'ledger_reserve_batch: the slice of account % changed while it was locked; try again', p_accounts[i]
                        USING ERRCODE = 'serialization_failure';
                END IF;
                IF onslice[i] AND ledger_slice_fits(leaf, delta[k], p_wants[i]) THEN
                    delta[k] := delta[k] + p_wants[i];
                    pend := pend || i;
                    grants := grants || p_wants[i];
                    avails := avails || NULL::bigint;
                    winds := winds || leaf.wind_down;
                    slc := slc || true;
                    seen := seen || (p_accounts[i]::text || ' ' || p_keys[i]);
                    CONTINUE;
                END IF;
                fast := false;
            END IF;
            IF fast THEN
                -- The grant rule, account by account, root first.
                FOREACH c IN ARRAY leaf.chain LOOP
                    j := array_position(ids, c);
                    g := ledger_grant_on(acc[j], delta[j], g, p_mins[i]);
                    IF g IS NULL THEN
                        fast := false;
                        EXIT;
                    END IF;
                END LOOP;
            END IF;
            IF fast THEN
                -- A grant that takes the run or the tenant below its minimum
                -- ends it: ledger_reserve does that.
                FOREACH c IN ARRAY leaf.chain LOOP
                    j := array_position(ids, c);
                    a := acc[j];
                    IF a.kind IN ('run', 'tenant') AND ledger_below_minimum(a, delta[j] + g) THEN
                        fast := false;
                        EXIT;
                    END IF;
                    IF a.kind = 'run' THEN
                        run_avail := ledger_available(a) - delta[j] - g;
                    END IF;
                END LOOP;
            END IF;
            IF fast THEN
                FOREACH c IN ARRAY leaf.chain LOOP
                    j := array_position(ids, c);
                    delta[j] := delta[j] + g;
                END LOOP;
                pend := pend || i;
                grants := grants || g;
                avails := avails || run_avail;
                winds := winds || leaf.wind_down;
                slc := slc || false;
                seen := seen || (p_accounts[i]::text || ' ' || p_keys[i]);
                CONTINUE;
            END IF;
        END IF;

        -- Write what was granted so far, then let ledger_reserve make the call.
        IF cardinality(pend) > 0 THEN
            FOR r IN
                WITH u AS (SELECT * FROM unnest(pend, grants, slc) WITH ORDINALITY AS u(ci, amount, sliced, ord)),
                ins AS (
                    INSERT INTO reservation (tenant_id, run_id, account_id, chain, requested, amount, holder,
                                             lease_expires_at, reserve_key, attempt, model, secret_hash)
                    SELECT l.tenant_id, l.run_id, l.account_id,
                           CASE WHEN u.sliced THEN ARRAY[l.account_id] ELSE l.chain END,
                           p_wants[u.ci], u.amount, p_holders[u.ci],
                           now() + p_ttls[u.ci], p_keys[u.ci], p_attempts[u.ci], nullif(p_models[u.ci], ''), l.secret_hash
                      FROM u JOIN account l ON l.account_id = p_accounts[u.ci]
                     ORDER BY u.ord
                    RETURNING *),
                ent AS (
                    INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, reservation_id,
                                              kind, delta_reserved, holder, model)
                    SELECT ins.tenant_id, ins.run_id, l.task_id, ins.account_id, ins.chain, ins.reservation_id,
                           'reserve', ins.amount, ins.holder, ins.model
                      FROM ins JOIN account l ON l.account_id = ins.account_id
                     ORDER BY ins.reservation_id)
                SELECT * FROM ins
            LOOP
                FOR k IN 1..cardinality(pend) LOOP
                    IF p_accounts[pend[k]] = r.account_id AND p_keys[pend[k]] = r.reserve_key THEN
                        res := ledger_result_of('ok', r);
                        res.run_available := avails[k];
                        res.wind_down := winds[k];
                        results[pend[k]] := res;
                        EXIT;
                    END IF;
                END LOOP;
            END LOOP;
            UPDATE account SET reserved = reserved + d.amount, updated_at = now()
              FROM unnest(ids, delta) AS d(account_id, amount)
             WHERE account.account_id = d.account_id AND d.amount <> 0;
            pend := '{}';
            grants := '{}';
            avails := '{}';
            winds := '{}';
            slc := '{}';
        END IF;
        EXIT WHEN i > n;
        results[i] := ledger_reserve(p_accounts[i], p_runs[i], p_tenants[i], p_attempts[i], p_wants[i], p_mins[i],
                                 p_holders[i], p_ttls[i], p_keys[i], p_models[i], p_secrets[i], p_from_held[i]);
        IF p_keys[i] IS NOT NULL THEN
            seen := seen || (p_accounts[i]::text || ' ' || p_keys[i]);
        END IF;
        SELECT coalesce(array_agg(l ORDER BY l.chain), '{}') INTO acc FROM account l WHERE l.account_id = ANY (ids);
        delta := array_fill(0::bigint, ARRAY[cardinality(ids)]);
    END LOOP;
    FOREACH res IN ARRAY results LOOP
        RETURN NEXT res;
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION ledger_reserve_batch(bigint[],text[],text[],bigint[],bigint[],bigint[],text[],interval[],text[],text[],text[],boolean[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_reserve_batch(bigint[],text[],text[],bigint[],bigint[],bigint[],text[],interval[],text[],text[],text[],boolean[]) TO fanout_app, fanout_worker;
