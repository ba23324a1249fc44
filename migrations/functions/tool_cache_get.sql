-- tool_cache_get returns tenant p_tenant's live cached result of tool
-- p_tool of server p_server called with the arguments that hash to
-- p_args_hash, or NULL (a miss). An entry at or past its expires_at
-- (database time, docs/ledger.md#i8-one-clock) is a miss, and is deleted
-- here. The caller proves the tenant with its task's attempt
-- (tool_cache_check); else invalid_authorization_specification (28000).
CREATE OR REPLACE FUNCTION tool_cache_get(p_account bigint, p_tenant text, p_run text, p_task text, p_secret text,
                                          p_server text, p_tool text, p_args_hash text)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    c tool_result_cache;
BEGIN
    IF NOT tool_cache_check(p_account, p_tenant, p_run, p_task, p_secret) THEN
        RAISE EXCEPTION 'tool_cache_get: account % is not of task % of run % of tenant %, or not with this secret',
            p_account, p_task, p_run, p_tenant USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    SELECT * INTO c FROM tool_result_cache
     WHERE tenant_id = p_tenant AND server = p_server AND tool = p_tool AND args_hash = p_args_hash;
    IF NOT FOUND THEN
        RETURN NULL;
    ELSIF c.expires_at <= now() THEN
        DELETE FROM tool_result_cache
         WHERE tenant_id = p_tenant AND server = p_server AND tool = p_tool AND args_hash = p_args_hash
           AND expires_at <= now();
        RETURN NULL;
    END IF;
    RETURN c.result;
END $$;
REVOKE ALL ON FUNCTION tool_cache_get(bigint,text,text,text,text,text,text,text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tool_cache_get(bigint,text,text,text,text,text,text,text) TO fanout_app, fanout_worker;
