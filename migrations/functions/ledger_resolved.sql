-- ledger_resolved is called when reservation r left the held state: if its
-- run waits to close (closing) and holds nothing more, the run closes now.
-- A call drawn on a task's slice first posts the slice to its run (the
-- run's chain is locked: a run that is not open has its slices' rows
-- marked, so ledger_lock_reservation took the whole chain), whose
-- reserved counts it. Callers hold the chain's locks.
CREATE OR REPLACE FUNCTION ledger_resolved(r reservation) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    run account;
BEGIN
    IF EXISTS (SELECT FROM account WHERE account_id = r.chain[1] AND kind = 'task') THEN
        SELECT * INTO run FROM account WHERE run_id = r.run_id AND kind = 'run' AND closing;
        IF FOUND THEN
            PERFORM ledger_uncarve(r.account_id, true);
            SELECT * INTO run FROM account WHERE account_id = run.account_id;
        END IF;
    ELSE
        SELECT * INTO run FROM account
         WHERE account_id = ANY (r.chain) AND kind = 'run' AND closing;
    END IF;
    IF run.account_id IS NOT NULL AND run.reserved = 0 THEN
        PERFORM ledger_close_run(run.account_id, 'run closed after its last held reservation resolved');
    END IF;
END $$;
REVOKE ALL ON FUNCTION ledger_resolved(reservation) FROM PUBLIC;
