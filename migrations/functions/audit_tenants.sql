-- audit_tenants returns the tenants the querying role may read: those of
-- every audit_role row whose role it has the privileges of. Inside a
-- SECURITY DEFINER function current_user is the owner, so the querying
-- role is taken as PostgreSQL sets current_user outside it: the role of
-- SET ROLE if one is set, else the session's login role (both can only be
-- roles the login may use). The policies call it once per statement
-- (an InitPlan: it is wrapped in a scalar subquery).
CREATE OR REPLACE FUNCTION audit_tenants() RETURNS text[]
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
    SELECT coalesce(array_agg(DISTINCT a.tenant_id ORDER BY a.tenant_id), '{}')
      FROM fanout.audit_role a
      JOIN pg_catalog.pg_roles r ON r.rolname = a.role_name
     WHERE pg_catalog.pg_has_role(
               CASE WHEN pg_catalog.current_setting('role') = 'none' THEN session_user::text
                    ELSE pg_catalog.current_setting('role') END::name,
               r.oid, 'USAGE')
$$;
REVOKE ALL ON FUNCTION audit_tenants() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION audit_tenants() TO fanout_app, fanout_tenant_auditor;
