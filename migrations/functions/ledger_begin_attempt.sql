-- ledger_begin_attempt records a new dispatch of an account's task (or of a
-- run's synthesis, on the run account) and returns its attempt number and
-- secret: a random 244-bit secret of which the account keeps only the
-- SHA-256. A worker's login must present it to reserve on the account and
-- to settle, void or renew what it reserved (ledger_secret_ok). Earlier
-- attempts can no longer reserve. An open run's accounts begin attempts;
-- so does an exhausted run's own account while it holds tokens for its
-- synthesis (which draws on them: ledger_reserve's p_from_held). A sliced
-- task account is given its slice_size, less what its slice still has,
-- from its run (ledger_carve; docs/ledger.md#budget-slices).
DROP FUNCTION IF EXISTS ledger_begin_attempt(bigint,text,text); -- its result gained the secret (0024)
CREATE FUNCTION ledger_begin_attempt(p_account bigint, p_run text, p_tenant text)
RETURNS TABLE (outcome text, attempt bigint, info_kind text, info_state text, secret text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
#variable_conflict use_column
DECLARE
    a   account;
    run account;
    s   text := replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '');
BEGIN
    SELECT * INTO a FROM account WHERE account_id = p_account;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not_found', 0::bigint, NULL::text, NULL::text, NULL::text;
        RETURN;
    END IF;
    IF a.kind = 'tenant' OR a.run_id IS DISTINCT FROM p_run OR a.tenant_id IS DISTINCT FROM p_tenant THEN
        RETURN QUERY SELECT 'denied', 0::bigint, a.kind, NULL::text, NULL::text;
        RETURN;
    END IF;
    SELECT * INTO run FROM account WHERE run_id = p_run AND kind = 'run';
    IF a.cap_tokens IS NOT NULL AND run.state = 'open' AND a.state = 'open' THEN
        -- A sliced task's slice is carved below, from its run: the chain's
        -- locks first, root first.
        PERFORM FROM ledger_lock_chain(a.chain);
    END IF;
    IF (run.state = 'open' AND a.state = 'open') OR (a.kind = 'run' AND a.state = 'exhausted' AND a.held > 0) THEN
        -- Waits for a reserve on this account that is under way, then
        -- re-reads the row: an account that left 'open' meanwhile is not bumped.
        UPDATE account SET attempt = account.attempt + 1, secret_hash = sha256(convert_to(s, 'UTF8')), updated_at = now()
         WHERE account_id = p_account
           AND (state = 'open' OR (kind = 'run' AND state = 'exhausted' AND held > 0))
        RETURNING * INTO a;
        IF FOUND THEN
            -- Read the run again: a cancel that committed while this
            -- statement waited changed only the run's row. (An attempt begun
            -- and refused here fences nothing that was not fenced already.)
            SELECT * INTO run FROM account WHERE run_id = p_run AND kind = 'run';
            IF run.state = 'open' OR (a.kind = 'run' AND run.state = 'exhausted' AND run.held > 0) THEN
                IF a.cap_tokens IS NOT NULL AND ledger_available(a) < a.slice_size THEN
                    PERFORM ledger_carve(a.account_id, a.slice_size - ledger_available(a));
                END IF;
                RETURN QUERY SELECT 'ok', a.attempt, a.kind, run.state, s;
                RETURN;
            END IF;
        ELSE
            SELECT * INTO a FROM account WHERE account_id = p_account;
        END IF;
    END IF;
    RETURN QUERY SELECT 'exhausted', 0::bigint, CASE WHEN run.state <> 'open' THEN 'run' ELSE a.kind END,
                        CASE WHEN run.state <> 'open' THEN run.state ELSE a.state END, NULL::text;
END $$;
REVOKE ALL ON FUNCTION ledger_begin_attempt(bigint,text,text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_begin_attempt(bigint,text,text) TO fanout_app;
