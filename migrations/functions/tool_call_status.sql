-- tool_call_status returns where the write tool call p_key stands, for the
-- worker waiting for its approval: its state, its error text (a denial's
-- reason) and whether its approval deadline has passed by the database's
-- clock. p_secret is the task's current attempt's (ledger_secret_ok): a
-- worker reads the calls of the tasks dispatched to it. No row when no call
-- has the key.
CREATE OR REPLACE FUNCTION tool_call_status(p_key text, p_secret text DEFAULT NULL)
RETURNS TABLE (state text, error text, expired boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
#variable_conflict use_column
DECLARE
    c tool_call;
BEGIN
    SELECT * INTO c FROM tool_call WHERE key = p_key;
    IF NOT FOUND THEN
        RETURN;
    ELSIF NOT session_is_orchestrator()
          AND NOT ledger_secret_ok((SELECT secret_hash FROM account
                                     WHERE tenant_id = c.tenant_id AND run_id = c.run_id AND task_id = c.task_id
                                       AND kind = 'task'), p_secret) THEN
        RAISE EXCEPTION 'tool_call_status: task % of run % was not dispatched with this secret', c.task_id, c.run_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN QUERY SELECT c.state, c.error, coalesce(now() >= c.approval_deadline, false);
END $$;
REVOKE ALL ON FUNCTION tool_call_status(text,text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tool_call_status(text,text) TO fanout_app, fanout_worker;
