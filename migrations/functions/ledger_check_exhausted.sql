-- ledger_check_exhausted marks the run in chain exhausted, once, when its
-- available tokens (what it holds for its synthesis is not) fall below its
-- min_reservation, and notifies every node. Its sliced task accounts take
-- the state too (ledger_mark_tasks).
-- Callers hold the chain's row locks.
CREATE OR REPLACE FUNCTION ledger_check_exhausted(p_chain bigint[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    a account;
BEGIN
    UPDATE account SET state = 'exhausted', cause = 'budget exhausted', updated_at = now()
     WHERE account_id = ANY (p_chain) AND kind = 'run' AND state = 'open'
       AND ledger_below_minimum(account, 0)
    RETURNING * INTO a;
    IF FOUND THEN
        INSERT INTO ledger_entry (tenant_id, run_id, account_id, chain, kind, note)
        VALUES (a.tenant_id, a.run_id, a.account_id, ARRAY[a.account_id], 'exhaust',
                format('available %s < min_reservation %s',
                       ledger_available(a), a.min_reservation));
        PERFORM ledger_mark_tasks(ARRAY[a.account_id], 'exhausted');
        PERFORM pg_notify('fanout_run_state', 'exhausted ' || a.run_id);
    END IF;
END $$;
REVOKE ALL ON FUNCTION ledger_check_exhausted(bigint[]) FROM PUBLIC;
