-- audit_refresh makes every view of schema fanout security_invoker, gives
-- fanout_tenant_auditor every (plain) view fanout_auditor may read, grants
-- each reader column-level SELECT on exactly the columns its views read
-- (following views of views), and puts row-level security with the three
-- policies on every table of the schema with a tenant_id column (the
-- process roles, fanout_app, fanout_worker and fanout_admin, see every row;
-- their privileges say what they may do). It can be
-- run again at any time and converges to the same privileges; a migration
-- that adds or replaces a view or a tenant table calls it last.
CREATE OR REPLACE FUNCTION audit_refresh() RETURNS void
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
    -- The process roles get only what they lack (they read most of the
    -- tables their views read whole).
    FOREACH reader IN ARRAY ARRAY['fanout_auditor', 'fanout_tenant_auditor', 'fanout_app', 'fanout_worker', 'fanout_admin'] LOOP
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
             WHERE reader NOT IN ('fanout_app', 'fanout_worker', 'fanout_admin')
                OR NOT has_table_privilege(reader, u.rel_oid, 'SELECT')
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
        -- No statistics on tenant_id: the planner's estimate for another
        -- tenant's rows (EXPLAIN, which row-level security does not hide)
        -- would count them (docs/auditing.md "What a tenant's auditor can
        -- infer").
        EXECUTE format('ALTER TABLE %s ALTER COLUMN tenant_id SET STATISTICS 0', rel);
        EXECUTE format('DROP POLICY IF EXISTS fanout_app_all ON %s', rel);
        EXECUTE format('DROP POLICY IF EXISTS fanout_auditor_read ON %s', rel);
        EXECUTE format('DROP POLICY IF EXISTS fanout_tenant_auditor_read ON %s', rel);
        EXECUTE format('CREATE POLICY fanout_app_all ON %s FOR ALL TO fanout_app, fanout_worker, fanout_admin USING (true) WITH CHECK (true)', rel);
        EXECUTE format('CREATE POLICY fanout_auditor_read ON %s FOR SELECT TO fanout_auditor USING (true)', rel);
        EXECUTE format('CREATE POLICY fanout_tenant_auditor_read ON %s FOR SELECT TO fanout_tenant_auditor
                        USING (tenant_id = ANY ((SELECT fanout.audit_tenants())::text[]))', rel);
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION audit_refresh() FROM PUBLIC;
