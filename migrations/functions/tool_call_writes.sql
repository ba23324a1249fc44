-- tool_call_writes returns every attempt's write tool calls of task p_task
-- of run p_run of tenant p_tenant, oldest first, for a new attempt to see
-- what earlier ones sent. p_secret is the task's current attempt's
-- (ledger_secret_ok): a worker reads the calls of the tasks dispatched to
-- it, no other tenant's results.
CREATE OR REPLACE FUNCTION tool_call_writes(p_tenant text, p_run text, p_task text, p_secret text DEFAULT NULL)
RETURNS SETOF tool_call
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    IF NOT ledger_secret_ok((SELECT secret_hash FROM account
                              WHERE tenant_id = p_tenant AND run_id = p_run AND task_id = p_task AND kind = 'task'),
                            p_secret) THEN
        RAISE EXCEPTION 'tool_call_writes: task % of run % was not dispatched with this secret', p_task, p_run
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN QUERY SELECT * FROM tool_call
                  WHERE tenant_id = p_tenant AND run_id = p_run AND task_id = p_task
                  ORDER BY created_at, attempt, iteration, call_index, key;
END $$;
REVOKE ALL ON FUNCTION tool_call_writes(text,text,text,text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tool_call_writes(text,text,text,text) TO fanout_app, fanout_worker;
