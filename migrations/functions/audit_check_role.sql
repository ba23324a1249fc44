-- audit_check_role raises unless p_role may be made a tenant's auditor: a
-- valid name that is none of fanout's own roles, no superuser or
-- BYPASSRLS role, and no role that already has the privileges of the
-- owner, fanout_app or fanout_auditor (it would see every tenant).
CREATE OR REPLACE FUNCTION audit_check_role(p_role text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    owner name := (SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'fanout');
    r     pg_roles;
    other text;
BEGIN
    IF p_role IS NULL OR p_role !~ '^[a-z_][a-z0-9_]{0,62}$' OR p_role LIKE 'pg\_%' THEN
        RAISE EXCEPTION 'role %: must be 1 to 63 lowercase letters, digits or underscores, not starting with a digit or pg_', coalesce(quote_literal(p_role), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_role IN ('fanout_app', 'fanout_auditor', 'fanout_tenant_auditor', owner, current_user, session_user) THEN
        RAISE EXCEPTION 'role %: is one of fanout''s own roles (fanout_app, fanout_auditor, fanout_tenant_auditor, the owner %)', p_role, owner
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO r FROM pg_roles WHERE rolname = p_role;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF r.rolsuper OR r.rolbypassrls THEN
        RAISE EXCEPTION 'role %: is a superuser or BYPASSRLS role, which reads every tenant', p_role
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOREACH other IN ARRAY ARRAY[owner::text, 'fanout_app', 'fanout_auditor'] LOOP
        IF pg_has_role(r.oid, other, 'MEMBER') THEN
            RAISE EXCEPTION 'role %: is a member of %, which reads every tenant', p_role, other
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION audit_check_role(text) FROM PUBLIC;
