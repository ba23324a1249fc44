-- audit_revoke ends p_role's reading of p_tenant. A role left auditing no
-- tenant loses fanout_tenant_auditor and USAGE on the schema; the role
-- itself is kept (the operator may use it elsewhere; DROP ROLE is theirs).
-- Raises if the role did not audit the tenant.
CREATE OR REPLACE FUNCTION audit_revoke(p_actor text, p_tenant text, p_role text, OUT tenants_left int)
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    IF p_actor IS NULL OR p_actor = '' THEN
        RAISE EXCEPTION 'actor: must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM audit_role WHERE role_name = p_role AND tenant_id = p_tenant;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'role %: does not audit tenant %', p_role, p_tenant
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT count(*) INTO tenants_left FROM audit_role WHERE role_name = p_role;
    IF tenants_left = 0 AND EXISTS (SELECT FROM pg_roles WHERE rolname = p_role) THEN
        EXECUTE format('REVOKE fanout_tenant_auditor FROM %I', p_role);
        EXECUTE format('REVOKE USAGE ON SCHEMA fanout FROM %I', p_role);
    END IF;
    PERFORM admin_log(p_actor, 'audit.revoke', p_tenant,
        jsonb_build_object('role', p_role, 'tenants_left', tenants_left));
END $$;
REVOKE ALL ON FUNCTION audit_revoke(text,text,text) FROM PUBLIC;
