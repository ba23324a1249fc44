-- ledger_resolved is called when reservation r left the held state: if its
-- run waits to close (closing) and holds nothing more, the run closes now.
-- Callers hold the chain's locks.
CREATE OR REPLACE FUNCTION ledger_resolved(r reservation) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    run account;
BEGIN
    SELECT * INTO run FROM account
     WHERE account_id = ANY (r.chain) AND kind = 'run' AND closing;
    IF FOUND AND run.reserved = 0 THEN
        PERFORM ledger_close_run(run.account_id, 'run closed after its last held reservation resolved');
    END IF;
END $$;
REVOKE ALL ON FUNCTION ledger_resolved(reservation) FROM PUBLIC;
