-- admin_create_tenant creates a tenant with its quotas. It is not
-- idempotent: a tenant that exists (made by a run before keys existed, or
-- by an earlier create) is unique_violation ("tenant X exists"), so that a
-- create never silently keeps quotas other than the ones asked for; change
-- those with admin_set_quotas.
CREATE OR REPLACE FUNCTION admin_create_tenant(p_actor text, p_tenant text, p_max_run_tokens bigint,
                                    p_max_concurrent_runs int, p_max_tasks_in_flight int,
                                    p_key_requests_per_minute int,
                                 p_headroom double precision DEFAULT NULL) RETURNS SETOF tenant
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    PERFORM admin_check_actor(p_actor);
    PERFORM admin_check_tenant_id(p_tenant);
    PERFORM admin_check_quotas(p_max_run_tokens, p_max_concurrent_runs, p_max_tasks_in_flight, p_key_requests_per_minute, p_headroom);
    INSERT INTO tenant (tenant_id, max_run_tokens, max_concurrent_runs, max_tasks_in_flight, key_requests_per_minute,
                        headroom)
    VALUES (p_tenant, p_max_run_tokens, p_max_concurrent_runs, p_max_tasks_in_flight, p_key_requests_per_minute,
            p_headroom)
    ON CONFLICT (tenant_id) DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'tenant_id: tenant % exists', p_tenant USING ERRCODE = 'unique_violation';
    END IF;
    PERFORM admin_log(p_actor, 'tenant.create', p_tenant, jsonb_build_object(
        'max_run_tokens', p_max_run_tokens, 'max_concurrent_runs', p_max_concurrent_runs,
        'max_tasks_in_flight', p_max_tasks_in_flight, 'key_requests_per_minute', p_key_requests_per_minute, 'headroom', p_headroom));
    RETURN QUERY SELECT * FROM tenant WHERE tenant_id = p_tenant;
END $$;
REVOKE ALL ON FUNCTION admin_create_tenant(text,text,bigint,integer,integer,integer,double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION admin_create_tenant(text,text,bigint,integer,integer,integer,double precision) TO fanout_admin;
