-- ledger_check_owner raises FA001 unless p_epoch is the number of times run
-- p_run has changed hands (run.adoptions): the fence of every ledger write
-- only the run's current owner may make (ledger_end_run_fenced, ledger_open_hedge,
-- ledger_wind_down). It holds the run's row FOR SHARE until the caller's
-- transaction ends, so an adoption cannot slip in between. A run with no
-- row (the ledger's own tests open runs without one) passes.
CREATE OR REPLACE FUNCTION ledger_check_owner(p_run text, p_epoch bigint, p_op text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    epoch bigint;
BEGIN
    SELECT r.adoptions INTO epoch FROM run r WHERE r.run_id = p_run FOR SHARE;
    IF FOUND AND epoch IS DISTINCT FROM p_epoch THEN
        RAISE EXCEPTION '%: run % changed hands % times, not %: another orchestrator drives it',
            p_op, p_run, epoch, p_epoch
            USING ERRCODE = 'FA001';
    END IF;
END $$;
REVOKE ALL ON FUNCTION ledger_check_owner(text,bigint,text) FROM PUBLIC;
