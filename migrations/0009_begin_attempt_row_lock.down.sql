-- Reverts 0009: ledger_begin_attempt locks the account chain again, as 0005 made it.

SET LOCAL search_path = fanout, pg_catalog;

CREATE OR REPLACE FUNCTION ledger_begin_attempt(p_account bigint, p_run text, p_tenant text)
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
