-- tool_call_end_run denies, as "run ended", every write tool call of run
-- p_run that waits for approval or was approved and not sent: the run's
-- close (store.Runs.CloseRun) calls it in its transaction, so no decision
-- can reach a call of an ended run. Returns how many it denied.
CREATE OR REPLACE FUNCTION tool_call_end_run(p_run text)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    n integer;
BEGIN
    WITH ended AS (
        SELECT c.key, c.call_id, c.tenant_id, c.state FROM tool_call c
         WHERE c.run_id = p_run AND c.state IN ('awaiting_approval', 'approved')
         ORDER BY c.key FOR UPDATE),
    decided AS (
        INSERT INTO tool_call_decision (call_id, tenant_id, run_id, decision, reason, actor)
        SELECT call_id, tenant_id, p_run, 'denied', 'run ended', 'fanout' FROM ended WHERE state = 'awaiting_approval')
    UPDATE tool_call c SET state = 'denied', error = 'denied: run ended'
      FROM ended WHERE c.key = ended.key;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;
REVOKE ALL ON FUNCTION tool_call_end_run(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tool_call_end_run(text) TO fanout_app;
