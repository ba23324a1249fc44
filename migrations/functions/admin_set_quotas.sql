-- admin_set_quotas sets all the quotas (and the headroom) of a tenant (NULL: no cap) and
-- signals every node on fanout_tenant_quotas (payload: the tenant id), in
-- the same transaction, so that a changed key rate reaches the keys in use.
-- An unknown tenant is no_data_found.
CREATE OR REPLACE FUNCTION admin_set_quotas(p_actor text, p_tenant text, p_max_run_tokens bigint,
                                 p_max_concurrent_runs int, p_max_tasks_in_flight int,
                                 p_key_requests_per_minute int,
                                 p_headroom double precision DEFAULT NULL) RETURNS SETOF tenant
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    PERFORM admin_check_actor(p_actor);
    PERFORM admin_check_tenant_id(p_tenant);
    PERFORM admin_check_quotas(p_max_run_tokens, p_max_concurrent_runs, p_max_tasks_in_flight, p_key_requests_per_minute, p_headroom);
    UPDATE tenant SET max_run_tokens = p_max_run_tokens, max_concurrent_runs = p_max_concurrent_runs,
                      max_tasks_in_flight = p_max_tasks_in_flight,
                      key_requests_per_minute = p_key_requests_per_minute, headroom = p_headroom,
                      updated_at = now()
     WHERE tenant_id = p_tenant;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'tenant_id: tenant % not found', p_tenant USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM admin_log(p_actor, 'tenant.set_quotas', p_tenant, jsonb_build_object(
        'max_run_tokens', p_max_run_tokens, 'max_concurrent_runs', p_max_concurrent_runs,
        'max_tasks_in_flight', p_max_tasks_in_flight, 'key_requests_per_minute', p_key_requests_per_minute, 'headroom', p_headroom));
    PERFORM pg_notify('fanout_tenant_quotas', p_tenant);
    RETURN QUERY SELECT * FROM tenant WHERE tenant_id = p_tenant;
END $$;
REVOKE ALL ON FUNCTION admin_set_quotas(text,text,bigint,integer,integer,integer,double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION admin_set_quotas(text,text,bigint,integer,integer,integer,double precision) TO fanout_admin;
