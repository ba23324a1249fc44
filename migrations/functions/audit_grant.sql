-- audit_grant makes p_role an auditor of tenant p_tenant: it creates the
-- role NOLOGIN if missing (the operator then gives it LOGIN and a password,
-- or grants it to a login role), grants it fanout_tenant_auditor and
-- USAGE on the schema, records it in audit_role, and logs the action. It
-- runs with the caller's rights: only the owner (a role that may create
-- roles) calls it. Returns whether the role was created and whether it
-- already audited the tenant.
CREATE OR REPLACE FUNCTION audit_grant(p_actor text, p_tenant text, p_role text,
                            OUT role_created boolean, OUT already_granted boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    IF p_actor IS NULL OR p_actor = '' THEN
        RAISE EXCEPTION 'actor: must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_tenant IS NULL OR p_tenant = '' OR length(p_tenant) > 128 THEN
        RAISE EXCEPTION 'tenant: must be 1 to 128 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM audit_check_role(p_role);
    IF NOT EXISTS (SELECT FROM tenant WHERE tenant_id = p_tenant) THEN
        RAISE EXCEPTION 'tenant %: not found', p_tenant USING ERRCODE = 'invalid_parameter_value';
    END IF;
    role_created := NOT EXISTS (SELECT FROM pg_roles WHERE rolname = p_role);
    IF role_created THEN
        EXECUTE format('CREATE ROLE %I NOLOGIN', p_role);
    END IF;
    EXECUTE format('GRANT fanout_tenant_auditor TO %I', p_role);
    EXECUTE format('GRANT USAGE ON SCHEMA fanout TO %I', p_role);
    INSERT INTO audit_role (role_name, tenant_id, granted_by) VALUES (p_role, p_tenant, p_actor)
    ON CONFLICT DO NOTHING;
    already_granted := NOT FOUND;
    PERFORM admin_log(p_actor, 'audit.grant', p_tenant,
        jsonb_build_object('role', p_role, 'role_created', role_created, 'already_granted', already_granted));
END $$;
REVOKE ALL ON FUNCTION audit_grant(text,text,text) FROM PUBLIC;
