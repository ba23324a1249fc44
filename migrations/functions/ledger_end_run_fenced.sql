CREATE OR REPLACE FUNCTION ledger_end_run_fenced(p_run text, p_state text, p_cause text, p_epoch bigint)
RETURNS SETOF account
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    PERFORM ledger_check_owner(p_run, p_epoch, 'ledger_end_run');
    RETURN QUERY SELECT * FROM ledger_end_run(p_run, p_state, p_cause);
END $$;
REVOKE ALL ON FUNCTION ledger_end_run_fenced(text,text,text,bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_end_run_fenced(text,text,text,bigint) TO fanout_app;
