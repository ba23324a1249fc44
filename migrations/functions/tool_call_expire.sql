-- tool_call_expire denies the write tool call p_key, waiting for approval,
-- whose deadline has passed (the database's clock), as expired: the worker
-- that waits for it calls it with its attempt's secret p_secret (of the
-- task's current attempt, ledger_secret_ok). It only ever denies. Returns
-- the call's state after (denied, or what a decision made it first), or
-- NULL when no call has the key.
CREATE OR REPLACE FUNCTION tool_call_expire(p_key text, p_secret text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    c tool_call;
BEGIN
    SELECT * INTO c FROM tool_call WHERE key = p_key;
    IF NOT FOUND THEN
        RETURN NULL;
    ELSIF NOT session_is_orchestrator()
          AND NOT ledger_secret_ok((SELECT secret_hash FROM account
                                     WHERE tenant_id = c.tenant_id AND run_id = c.run_id AND task_id = c.task_id
                                       AND kind = 'task'), p_secret) THEN
        RAISE EXCEPTION 'tool_call_expire: task % of run % was not dispatched with this secret', c.task_id, c.run_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT * INTO c FROM tool_call WHERE key = p_key FOR UPDATE;
    IF c.state = 'awaiting_approval' AND now() >= c.approval_deadline THEN
        INSERT INTO tool_call_decision (call_id, tenant_id, run_id, decision, reason, actor)
        VALUES (c.call_id, c.tenant_id, c.run_id, 'denied', 'expired', 'fanout');
        UPDATE tool_call SET state = 'denied', error = 'denied: the approval expired' WHERE key = p_key;
        RETURN 'denied';
    END IF;
    RETURN c.state;
END $$;
REVOKE ALL ON FUNCTION tool_call_expire(text,text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tool_call_expire(text,text) TO fanout_app, fanout_worker;
