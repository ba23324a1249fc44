-- ledger_open_hedge opens (or returns) the account of a hedged task's
-- second attempt (docs/budget.md#hedged-tasks): a task account of its own,
-- task id '_hedge:' || the task's, beside the task's under the run, with
-- the task's token budget (its cap, if sliced) as its limit. The two
-- attempts run at once, each fenced on its own account; what the second
-- spends is on its account, and the task's spend is both. Only an open
-- run's open, unhedged task account of p_run and p_tenant opens one, and
-- only for the run's current owner (p_epoch, ledger_check_owner): an
-- orchestrator that lost the run cannot open a hedge the adopter's
-- snapshot of the run's accounts (read after the adoption) lacks. A hedge
-- of a task that is wound down opens wound down (ledger_wind_down marks
-- both attempts).
-- Returns ok (with the account), not_found, denied (not a task account of
-- p_run and p_tenant, or a hedge's own) or exhausted (the run or the task
-- account has ended; info_kind and info_state say which).
DROP FUNCTION IF EXISTS ledger_open_hedge(bigint,text,text);
CREATE OR REPLACE FUNCTION ledger_open_hedge(p_task_account bigint, p_run text, p_tenant text, p_epoch bigint)
RETURNS TABLE (outcome text, account_id bigint, info_kind text, info_state text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
#variable_conflict use_column
DECLARE
    t   account;
    run account;
    h   account;
    v_id bigint;
BEGIN
    PERFORM ledger_check_owner(p_run, p_epoch, 'ledger_open_hedge');
    SELECT * INTO t FROM account WHERE account.account_id = p_task_account;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not_found', 0::bigint, NULL::text, NULL::text;
        RETURN;
    END IF;
    IF t.kind <> 'task' OR t.run_id IS DISTINCT FROM p_run OR t.tenant_id IS DISTINCT FROM p_tenant
       OR t.task_id LIKE '\_hedge:%' THEN
        RETURN QUERY SELECT 'denied', 0::bigint, t.kind, NULL::text;
        RETURN;
    END IF;
    -- The run's row, locked: two opens of one hedge wait for each other,
    -- and a cancel that commits first is read.
    SELECT * INTO run FROM account WHERE account.account_id = t.parent_id FOR UPDATE;
    SELECT * INTO h FROM account WHERE account.run_id = p_run AND account.kind = 'task'
                                   AND account.task_id = '_hedge:' || t.task_id;
    IF FOUND THEN
        RETURN QUERY SELECT 'ok', h.account_id, h.kind, h.state;
        RETURN;
    END IF;
    SELECT * INTO t FROM account WHERE account.account_id = p_task_account;
    IF run.state <> 'open' OR t.state <> 'open' THEN
        RETURN QUERY SELECT 'exhausted', 0::bigint, CASE WHEN run.state <> 'open' THEN 'run' ELSE 'task' END,
                            CASE WHEN run.state <> 'open' THEN run.state ELSE t.state END;
        RETURN;
    END IF;
    INSERT INTO account (tenant_id, parent_id, chain, kind, run_id, task_id, limit_tokens, min_reservation, wind_down)
    VALUES (t.tenant_id, run.account_id, '{}', 'task', p_run, '_hedge:' || t.task_id,
            coalesce(t.cap_tokens, t.limit_tokens), t.min_reservation, t.wind_down)
    RETURNING account.account_id INTO v_id;
    UPDATE account SET chain = run.chain || v_id WHERE account.account_id = v_id;
    INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, kind, delta_limit, note)
    VALUES (t.tenant_id, p_run, '_hedge:' || t.task_id, v_id, ARRAY[v_id], 'open',
            coalesce(t.cap_tokens, t.limit_tokens), 'a hedged task''s second attempt');
    RETURN QUERY SELECT 'ok', v_id, 'task'::text, 'open'::text;
END $$;
REVOKE ALL ON FUNCTION ledger_open_hedge(bigint,text,text,bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_open_hedge(bigint,text,text,bigint) TO fanout_app;
