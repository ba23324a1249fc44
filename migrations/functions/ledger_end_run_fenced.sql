CREATE OR REPLACE FUNCTION ledger_end_run_fenced(p_run text, p_state text, p_cause text, p_epoch bigint)
RETURNS SETOF account
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    epoch bigint;
BEGIN
    SELECT r.adoptions INTO epoch FROM run r WHERE r.run_id = p_run FOR SHARE;
    IF FOUND AND epoch IS DISTINCT FROM p_epoch THEN
        RAISE EXCEPTION 'ledger_end_run: run % changed hands % times, not %: another orchestrator drives it',
            p_run, epoch, p_epoch
            USING ERRCODE = 'FA001';
    END IF;
    RETURN QUERY SELECT * FROM ledger_end_run(p_run, p_state, p_cause);
END $$;
REVOKE ALL ON FUNCTION ledger_end_run_fenced(text,text,text,bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_end_run_fenced(text,text,text,bigint) TO fanout_app;
