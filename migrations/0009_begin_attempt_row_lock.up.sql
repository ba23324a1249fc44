-- ledger_begin_attempt locks only the account it bumps (issue 11).
--
-- 0005's version locked the whole account chain, root first, like the
-- functions that move tokens. Every dispatch of a run therefore queued on the
-- run account's row lock and committed alone: `make bench-compare` showed a
-- 1,000-task run's dispatches starting one flush (~2.5 ms) apart, the first
-- task 4 s after the run was accepted, while the orchestrator's whole pool
-- waited on that lock.
--
-- The chain lock bought nothing here. begin_attempt moves no tokens; what it
-- must guarantee is that from its commit on, only the new attempt can
-- reserve on the account, and ledger_reserve checks the attempt under its
-- own chain lock. Its UPDATE of the one account row serializes it against
-- every reserve on that account (which holds the row from the reserve's
-- start to its commit) without waiting on the root, and it never waits on
-- another row while holding this one, so it cannot deadlock with the
-- functions that lock root first. The run's state is read at the
-- statement's snapshot: a run that ends (exhausted, cancelled, closed) after
-- that read ends after this attempt began, exactly as if the attempt had
-- committed first, and ledger_reserve refuses the attempt's reserves.

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
    SELECT * INTO run FROM account WHERE run_id = p_run AND kind = 'run';
    IF run.state = 'open' AND a.state = 'open' THEN
        -- Waits for a reserve on this account that is under way, then
        -- re-reads the row: an account that left 'open' meanwhile is not bumped.
        UPDATE account SET attempt = account.attempt + 1, updated_at = now()
         WHERE account_id = p_account AND state = 'open'
        RETURNING * INTO a;
        IF FOUND THEN
            -- Read the run again: a cancel that committed while this
            -- statement waited changed only the run's row. (An attempt begun
            -- and refused here fences nothing that was not fenced already.)
            SELECT * INTO run FROM account WHERE run_id = p_run AND kind = 'run';
            IF run.state = 'open' THEN
                RETURN QUERY SELECT 'ok', a.attempt, a.kind, 'open'::text;
                RETURN;
            END IF;
        ELSE
            SELECT * INTO a FROM account WHERE account_id = p_account;
        END IF;
    END IF;
    RETURN QUERY SELECT 'exhausted', 0::bigint, CASE WHEN run.state <> 'open' THEN 'run' ELSE a.kind END,
                        CASE WHEN run.state <> 'open' THEN run.state ELSE a.state END;
END $$;
