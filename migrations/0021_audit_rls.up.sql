-- Per-tenant audit (issue 14): a role made for one tenant reads only that
-- tenant's rows, in every audit view; fanout_auditor stays the global reader.
--
-- How: every view in schema fanout is security_invoker (PostgreSQL 15 and
-- later; `fanout migrate` refuses older servers), so a view reads its
-- tables with the privileges and row-level security of the role querying
-- it, not of the view's owner. Every table in the schema with a tenant_id
-- column has row-level security with one policy per reader:
--
--   fanout_app             FOR ALL    USING (true) WITH CHECK (true)
--   fanout_auditor         FOR SELECT USING (true)
--   fanout_tenant_auditor  FOR SELECT USING (tenant_id = ANY (audit_tenants()))
--
-- and any other role (PUBLIC) sees no row. The owner (the role that runs
-- migrations, and so every SECURITY DEFINER ledger function) owns the
-- tables and bypasses row-level security: there is no FORCE. Tables
-- without tenant_id (rate_bucket, semaphore_slot, a price table) hold no
-- tenant's data and stay as they were.
--
-- Because an invoker's view needs the invoker's own privileges on what it
-- reads, the auditors get column-level SELECT on exactly the columns the
-- views read (from pg_depend), and nothing else: a column no view reads,
-- such as run.spec, stays unreadable to them.
--
-- All of that is done by audit_refresh(), for whatever views and tables
-- exist when it runs: a later migration that adds or replaces a view, or
-- adds a table with tenant_id, ends with `SELECT fanout.audit_refresh();`.
--
-- A tenant's auditor is a role in fanout_tenant_auditor with a row in
-- audit_role naming the tenant; `fanout audit grant --tenant acme --role
-- acme_auditor` (audit_grant below) makes one.

SET LOCAL search_path = fanout, pg_catalog;

-- Roles are cluster-wide: create it only when missing.
DO $$
BEGIN
    CREATE ROLE fanout_tenant_auditor NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END $$;
GRANT USAGE ON SCHEMA fanout TO fanout_tenant_auditor;

-- Who may read which tenant. Readable by the owner only (audit_tenants
-- reads it for the caller).
CREATE TABLE audit_role (
    role_name  text NOT NULL CHECK (role_name ~ '^[a-z_][a-z0-9_]{0,62}$'),
    tenant_id  text NOT NULL REFERENCES tenant (tenant_id),
    granted_at timestamptz NOT NULL DEFAULT now(),
    granted_by text NOT NULL CHECK (granted_by <> ''),
    PRIMARY KEY (role_name, tenant_id)
);
REVOKE ALL ON audit_role FROM PUBLIC;
COMMENT ON TABLE audit_role IS
    'Per-tenant auditors: role_name (a member of fanout_tenant_auditor) reads the rows of tenant_id.';

-- audit_tenants returns the tenants the querying role may read: those of
-- every audit_role row whose role it has the privileges of. Inside a
-- SECURITY DEFINER function current_user is the owner, so the querying
-- role is taken as PostgreSQL sets current_user outside it: the role of
-- SET ROLE if one is set, else the session's login role (both can only be
-- roles the login may use). The policies call it once per statement
-- (an InitPlan: it is wrapped in a scalar subquery).
CREATE FUNCTION audit_tenants() RETURNS text[]
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
-- fanout_app may call it too (every SECURITY DEFINER function is a node's:
-- store's TestSecurityDefinerFunctionsArePinned); its own policy ignores it.
GRANT EXECUTE ON FUNCTION audit_tenants() TO fanout_tenant_auditor, fanout_app;

-- audit_refresh makes every view of schema fanout security_invoker, gives
-- fanout_tenant_auditor every (plain) view fanout_auditor may read, grants
-- each reader column-level SELECT on exactly the columns its views read
-- (following views of views), and puts row-level security with the three
-- policies on every table of the schema with a tenant_id column. It can be
-- run again at any time and converges to the same privileges; a migration
-- that adds or replaces a view or a tenant table calls it last.
CREATE FUNCTION audit_refresh() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    ns     oid := 'fanout'::regnamespace;
    rel    regclass;
    reader text;
    cols   text;
BEGIN
    FOR rel IN SELECT c.oid FROM pg_class c WHERE c.relnamespace = ns AND c.relkind = 'v' ORDER BY c.relname LOOP
        EXECUTE format('ALTER VIEW %s SET (security_invoker = true)', rel);
    END LOOP;

    -- The tenant auditor reads what the global auditor reads. A
    -- materialized view cannot be row-secured: it is not given.
    FOR rel IN SELECT c.oid FROM pg_class c
                WHERE c.relnamespace = ns AND c.relkind = 'v'
                  AND has_table_privilege('fanout_auditor', c.oid, 'SELECT')
                ORDER BY c.relname LOOP
        EXECUTE format('GRANT SELECT ON %s TO fanout_tenant_auditor', rel);
    END LOOP;
    FOR rel IN SELECT c.oid FROM pg_class c
                WHERE c.relnamespace = ns AND c.relkind = 'm'
                  AND has_table_privilege('fanout_auditor', c.oid, 'SELECT') LOOP
        RAISE WARNING 'audit_refresh: materialized view % is not row-secured; fanout_tenant_auditor is not given it', rel;
    END LOOP;

    -- Start the auditors' grants on tenant data over, so that they stay
    -- exactly what the views read (REVOKE on a table also revokes its
    -- column grants).
    FOR rel IN SELECT c.oid FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
                WHERE c.relnamespace = ns AND c.relkind IN ('r', 'p')
                  AND a.attname = 'tenant_id' AND NOT a.attisdropped LOOP
        EXECUTE format('REVOKE SELECT ON %s FROM fanout_auditor, fanout_tenant_auditor', rel);
    END LOOP;

    -- Column grants: for each reader, the columns of every relation in the
    -- schema that its views read, directly or through other views.
    -- fanout_app gets only what it lacks (it reads most tables whole).
    FOREACH reader IN ARRAY ARRAY['fanout_auditor', 'fanout_tenant_auditor', 'fanout_app'] LOOP
        FOR rel, cols IN
            WITH RECURSIVE readable AS (
                SELECT c.oid FROM pg_class c
                 WHERE c.relnamespace = ns AND c.relkind = 'v'
                   AND has_table_privilege(reader, c.oid, 'SELECT')
            ), uses(view_oid, rel_oid, attnum) AS (
                SELECT rw.ev_class, d.refobjid, d.refobjsubid
                  FROM pg_rewrite rw
                  JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = rw.oid
                                  AND d.refclassid = 'pg_class'::regclass AND d.refobjid <> rw.ev_class
                 WHERE rw.ev_class IN (SELECT oid FROM readable)
                UNION
                SELECT rw.ev_class, d.refobjid, d.refobjsubid
                  FROM uses u
                  JOIN pg_class v ON v.oid = u.rel_oid AND v.relkind = 'v'
                  JOIN pg_rewrite rw ON rw.ev_class = v.oid
                  JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = rw.oid
                                  AND d.refclassid = 'pg_class'::regclass AND d.refobjid <> rw.ev_class
            )
            SELECT u.rel_oid::regclass, string_agg(DISTINCT quote_ident(a.attname), ', ')
              FROM uses u
              JOIN pg_class t ON t.oid = u.rel_oid AND t.relnamespace = ns AND t.relkind IN ('r', 'p', 'v')
              JOIN pg_attribute a ON a.attrelid = u.rel_oid AND a.attnum = u.attnum AND u.attnum > 0
                                 AND NOT a.attisdropped
             WHERE reader <> 'fanout_app' OR NOT has_table_privilege(reader, u.rel_oid, 'SELECT')
             GROUP BY u.rel_oid
        LOOP
            EXECUTE format('GRANT SELECT (%s) ON %s TO %I', cols, rel, reader);
        END LOOP;
    END LOOP;

    -- Row-level security on every tenant table.
    FOR rel IN SELECT c.oid FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
                WHERE c.relnamespace = ns AND c.relkind IN ('r', 'p')
                  AND a.attname = 'tenant_id' AND NOT a.attisdropped
                ORDER BY c.relname LOOP
        EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', rel);
        EXECUTE format('DROP POLICY IF EXISTS fanout_app_all ON %s', rel);
        EXECUTE format('DROP POLICY IF EXISTS fanout_auditor_read ON %s', rel);
        EXECUTE format('DROP POLICY IF EXISTS fanout_tenant_auditor_read ON %s', rel);
        EXECUTE format('CREATE POLICY fanout_app_all ON %s FOR ALL TO fanout_app USING (true) WITH CHECK (true)', rel);
        EXECUTE format('CREATE POLICY fanout_auditor_read ON %s FOR SELECT TO fanout_auditor USING (true)', rel);
        EXECUTE format('CREATE POLICY fanout_tenant_auditor_read ON %s FOR SELECT TO fanout_tenant_auditor
                        USING (tenant_id = ANY ((SELECT fanout.audit_tenants())::text[]))', rel);
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION audit_refresh() FROM PUBLIC;

-- audit_check_role raises unless p_role may be made a tenant's auditor: a
-- valid name that is none of fanout's own roles, no superuser or
-- BYPASSRLS role, and no role that already has the privileges of the
-- owner, fanout_app or fanout_auditor (it would see every tenant).
CREATE FUNCTION audit_check_role(p_role text) RETURNS void
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

-- audit_grant makes p_role an auditor of tenant p_tenant: it creates the
-- role NOLOGIN if missing (the operator then gives it LOGIN and a password,
-- or grants it to a login role), grants it fanout_tenant_auditor and
-- USAGE on the schema, records it in audit_role, and logs the action. It
-- runs with the caller's rights: only the owner (a role that may create
-- roles) calls it. Returns whether the role was created and whether it
-- already audited the tenant.
CREATE FUNCTION audit_grant(p_actor text, p_tenant text, p_role text,
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
REVOKE ALL ON FUNCTION audit_grant(text, text, text) FROM PUBLIC;

-- audit_revoke ends p_role's reading of p_tenant. A role left auditing no
-- tenant loses fanout_tenant_auditor and USAGE on the schema; the role
-- itself is kept (the operator may use it elsewhere; DROP ROLE is theirs).
-- Raises if the role did not audit the tenant.
CREATE FUNCTION audit_revoke(p_actor text, p_tenant text, p_role text, OUT tenants_left int)
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
REVOKE ALL ON FUNCTION audit_revoke(text, text, text) FROM PUBLIC;

-- A view that reads a column makes that column readable by its readers
-- (they need SELECT on it). Two views read content only to measure it:
-- task_outcome the error inside task.outcome (the whole TaskOutcome, facts
-- included) and tool_calls the length of tool_call.result (what a tool
-- returned). They now read generated columns instead, so the auditors get
-- neither content column. A new view must do the same: read a generated
-- column, never the content itself.
ALTER TABLE task ADD COLUMN outcome_error text GENERATED ALWAYS AS (outcome->'summary'->>'error') STORED;
ALTER TABLE tool_call ADD COLUMN result_bytes int GENERATED ALWAYS AS (octet_length(result)) STORED;
COMMENT ON COLUMN task.outcome_error IS 'outcome->''summary''->>''error'', kept so that task_outcome need not read outcome.';
COMMENT ON COLUMN tool_call.result_bytes IS 'octet_length(result), kept so that tool_calls need not read result.';

CREATE OR REPLACE VIEW task_outcome AS
SELECT t.tenant_id, t.run_id, t.task_id, t.dispatch_index, t.status,
       t.outcome_error AS error,
       t.tokens_spent, nullif(t.worker, '') AS worker, t.started_at, t.finished_at
  FROM task t;

CREATE OR REPLACE VIEW tool_calls AS
SELECT tenant_id, run_id, task_id, attempt, iteration, call_index, server, tool, key,
       args_digest, state, nullif(error, '') AS error, result_bytes,
       created_at, resolved_at
  FROM tool_call;

SELECT audit_refresh();
