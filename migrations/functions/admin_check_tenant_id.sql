-- admin_check_tenant_id raises unless p_tenant is a valid tenant id (the
-- rule of the tenant table and the orchestrator: 1..128 bytes).
CREATE OR REPLACE FUNCTION admin_check_tenant_id(p_tenant text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    IF p_tenant IS NULL OR p_tenant = '' OR octet_length(p_tenant) > 128 THEN
        RAISE EXCEPTION 'tenant_id: must be 1..128 bytes, got %', coalesce(octet_length(p_tenant), 0)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;
REVOKE ALL ON FUNCTION admin_check_tenant_id(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION admin_check_tenant_id(text) TO fanout_admin;
