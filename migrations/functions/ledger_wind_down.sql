-- ledger_wind_down marks run p_run as winding down (account.wind_down): what
-- it has left pays only for final answers (DESIGN §9). Every grant on the
-- run from then on carries the mark (ledger_result.run_wind_down), and the
-- subagent that asked makes that iteration its last, without tools. Only
-- the run's current owner marks it (p_epoch, as ledger_end_run_fenced);
-- marking an ended or already marked run changes nothing. Returns whether
-- the run is marked now.
CREATE OR REPLACE FUNCTION ledger_wind_down(p_run text, p_epoch bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    marked boolean;
BEGIN
    PERFORM ledger_check_owner(p_run, p_epoch, 'ledger_wind_down');
    UPDATE account a SET wind_down = true, updated_at = now()
     WHERE a.kind = 'run' AND a.run_id = p_run AND a.state IN ('open', 'exhausted') AND NOT a.wind_down;
    SELECT a.wind_down INTO marked FROM account a WHERE a.kind = 'run' AND a.run_id = p_run;
    RETURN coalesce(marked, false);
END $$;
REVOKE ALL ON FUNCTION ledger_wind_down(text,bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_wind_down(text,bigint) TO fanout_app;
