-- ledger_close_run closes a run account and its task accounts, once.
-- Callers hold the run's lock and know nothing is held in the run. A child
-- run still going below it (its funding expired, so nothing is held) is
-- cancelled at every depth in the same commit (docs/ledger.md#child-runs).
CREATE OR REPLACE FUNCTION ledger_close_run(p_run_account bigint, p_note text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    a account;
BEGIN
    SELECT * INTO a FROM account WHERE account_id = p_run_account;
    IF a.state = 'closed' THEN
        RETURN;
    END IF;
    PERFORM ledger_mark_tasks(ARRAY[a.account_id], 'cancelled');
    UPDATE account SET state = 'closed', closing = false,
                       cause = CASE WHEN state = 'open' THEN coalesce(p_note, '') ELSE cause END,
                       updated_at = now()
     WHERE run_id = a.run_id AND state <> 'closed';
    INSERT INTO ledger_entry (tenant_id, run_id, account_id, chain, kind, note)
    VALUES (a.tenant_id, a.run_id, a.account_id, ARRAY[a.account_id], 'close', coalesce(p_note, ''));
    PERFORM pg_notify('fanout_run_state', 'closed ' || a.run_id);
END $$;
REVOKE ALL ON FUNCTION ledger_close_run(bigint,text) FROM PUBLIC;
