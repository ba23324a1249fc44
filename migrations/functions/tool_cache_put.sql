-- tool_cache_put stores what a read call of tool p_tool of server p_server
-- with the arguments that hash to p_args_hash returned, for tenant
-- p_tenant, until now() plus p_ttl_ms milliseconds (database time; at most
-- 24 hours), replacing the entry of that key. A result over 16 MiB
-- (mcp.MaxMaxResultBytes, the cap of a tool result) is not stored: it
-- returns false. Under the tenant's lock, it first deletes up to 100 of the
-- tenant's expired entries, and after the insert the tenant's oldest
-- entries past 10,000, so the table stays bounded. The caller proves the
-- tenant with its task's attempt (tool_cache_check); else
-- invalid_authorization_specification (28000: not 42501, which is the
-- role's privilege). Whether the tool is a read is the worker's to know
-- (its policy): it never calls this for a write.
CREATE OR REPLACE FUNCTION tool_cache_put(p_account bigint, p_tenant text, p_run text, p_task text, p_secret text,
                                          p_server text, p_tool text, p_args_hash text, p_result jsonb, p_ttl_ms bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    IF NOT tool_cache_check(p_account, p_tenant, p_run, p_task, p_secret) THEN
        RAISE EXCEPTION 'tool_cache_put: account % is not of task % of run % of tenant %, or not with this secret',
            p_account, p_task, p_run, p_tenant USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    IF p_ttl_ms IS NULL OR p_ttl_ms <= 0 OR p_ttl_ms > 86400000 THEN
        RAISE EXCEPTION 'tool_cache_put: a TTL is 1 ms to 24 hours, got % ms', p_ttl_ms
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_result IS NULL OR octet_length(p_result::text) > 16777216 THEN
        RETURN false;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('fanout.tool_result_cache:' || p_tenant, 0));
    DELETE FROM tool_result_cache
     WHERE ctid IN (SELECT ctid FROM tool_result_cache
                     WHERE tenant_id = p_tenant AND expires_at <= now() LIMIT 100);
    INSERT INTO tool_result_cache (tenant_id, server, tool, args_hash, result, created_at, expires_at)
    VALUES (p_tenant, p_server, p_tool, p_args_hash, p_result, now(), now() + p_ttl_ms * interval '1 millisecond')
    ON CONFLICT (tenant_id, server, tool, args_hash)
    DO UPDATE SET result = EXCLUDED.result, created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at;
    DELETE FROM tool_result_cache
     WHERE ctid IN (SELECT ctid FROM tool_result_cache
                     WHERE tenant_id = p_tenant ORDER BY created_at DESC, args_hash OFFSET 10000);
    RETURN true;
END $$;
REVOKE ALL ON FUNCTION tool_cache_put(bigint,text,text,text,text,text,text,text,jsonb,bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tool_cache_put(bigint,text,text,text,text,text,text,text,jsonb,bigint) TO fanout_app, fanout_worker;
