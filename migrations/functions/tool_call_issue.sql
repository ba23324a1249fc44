-- tool_call_issue records a write tool call before it is sent, fenced by
-- the task account's current attempt; p_secret is that attempt's
-- (ledger_secret_ok), and the call keeps its hash so that only the attempt
-- that issued it resolves it (tool_call_resolve). A call the run's recorded
-- policy (run_tool_policy) says needs approval is recorded
-- awaiting_approval instead, with p_preview and a deadline (now plus the
-- policy's timeout), and is sent only once approved (tool_call_send); a
-- tool the policy does not name is denied when the run has a policy.
-- Returns issued, awaiting_approval, exists (the key's row is there: read
-- it), superseded or denied.
CREATE OR REPLACE FUNCTION tool_call_issue(p_account bigint, p_key text, p_tenant text, p_run text, p_task text,
                                p_attempt bigint, p_iteration int, p_index int, p_server text, p_tool text,
                                p_digest text, p_preview text, p_secret text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    a account;
    c tool_call;
    pol run_tool_policy;
BEGIN
    -- A worker's login names its call by its place in the task's attempt
    -- (subagent/toolrun.go): it cannot take another task's key.
    IF NOT session_is_orchestrator()
       AND p_key IS DISTINCT FROM format('%s/%s/a%s/i%s/c%s', p_run, p_task, p_attempt, p_iteration, p_index) THEN
        RETURN 'denied';
    END IF;
    -- Everything up to the insert is read without a lock, so that a caller
    -- without the secret locks nothing.
    SELECT * INTO a FROM account WHERE account_id = p_account;
    IF NOT FOUND OR a.run_id IS DISTINCT FROM p_run OR a.tenant_id IS DISTINCT FROM p_tenant
       OR a.kind = 'tenant' OR (a.kind = 'task' AND a.task_id IS DISTINCT FROM p_task) THEN
        RETURN 'denied';
    END IF;
    -- A retry of an issue whose first try committed (its reply lost) finds
    -- its row, also after a new attempt began: that attempt, which reads
    -- the task's writes after it began, sees the row too.
    SELECT * INTO c FROM tool_call WHERE key = p_key;
    IF FOUND THEN
        IF NOT ledger_secret_ok(c.secret_hash, p_secret)
           OR (c.tenant_id, c.run_id, c.task_id) IS DISTINCT FROM (p_tenant, p_run, p_task) THEN
            RETURN 'denied';
        END IF;
        RETURN 'exists';
    END IF;
    IF a.attempt IS DISTINCT FROM p_attempt THEN
        RETURN 'superseded';
    ELSIF NOT ledger_secret_ok(a.secret_hash, p_secret) THEN
        RETURN 'denied';
    END IF;
    SELECT * INTO pol FROM run_tool_policy WHERE run_id = p_run AND tool = p_tool;
    IF NOT FOUND AND EXISTS (SELECT FROM run_tool_policy WHERE run_id = p_run) THEN
        RETURN 'denied';
    END IF;
    -- The insert, under a share lock of the account that
    -- ledger_begin_attempt waits for: checked again as of the lock.
    SELECT * INTO a FROM account WHERE account_id = p_account FOR SHARE;
    IF a.attempt IS DISTINCT FROM p_attempt THEN
        RETURN 'superseded';
    END IF;
    INSERT INTO tool_call (key, tenant_id, run_id, task_id, attempt, iteration, call_index, server, tool, args_digest,
                           secret_hash, state, preview, approval_deadline)
    VALUES (p_key, p_tenant, p_run, p_task, p_attempt, p_iteration, p_index, p_server, p_tool, p_digest, a.secret_hash,
            CASE WHEN pol.approval THEN 'awaiting_approval' ELSE 'issued' END, coalesce(p_preview, ''),
            CASE WHEN pol.approval THEN now() + pol.approval_timeout_ms * interval '1 millisecond' END)
    ON CONFLICT (key) DO NOTHING;
    IF FOUND THEN
        RETURN CASE WHEN pol.approval THEN 'awaiting_approval' ELSE 'issued' END;
    END IF;
    RETURN 'exists';
END $$;
REVOKE ALL ON FUNCTION tool_call_issue(bigint,text,text,text,text,bigint,integer,integer,text,text,text,text,text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tool_call_issue(bigint,text,text,text,text,bigint,integer,integer,text,text,text,text,text) TO fanout_app, fanout_worker;
