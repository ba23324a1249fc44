-- ledger_end_run_fenced: a run's owner ends its ledger run only while it
-- still owns the run (issue 12).
--
-- A run changes hands when its orchestrator is lost: the adopter resumes it
-- (and fences the old owner's reserves with new attempts). But an old owner
-- that was only paused (a GC pause, a partition) could still reach the end
-- of the run it no longer drives and cancel or close its ledger run, and so
-- stop the adopter's tasks and synthesis. This function is ledger_end_run
-- fenced by the run's owner epoch: p_epoch must be run.adoptions, the
-- number of times the run changed hands, as the caller found it when it
-- took the run (0 for the replica that created it). Every adoption by
-- another replica bumps it under the run row's lock; this function holds
-- that row FOR SHARE until it commits, so an adoption and an old owner's
-- end serialize. A stale epoch changes nothing and raises FA001.

SET LOCAL search_path = fanout, pg_catalog;

CREATE FUNCTION ledger_end_run_fenced(p_run text, p_state text, p_cause text, p_epoch bigint)
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

REVOKE ALL ON FUNCTION ledger_end_run_fenced(text, text, text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_end_run_fenced(text, text, text, bigint) TO fanout_app;
