-- Reverts 0021: views run with their owner's rights again, no row-level
-- security, no per-tenant auditors. The role fanout_tenant_auditor and the
-- roles audit_grant created are cluster-wide and kept (other databases may
-- use them); their privileges in this database are revoked.

SET LOCAL search_path = fanout, pg_catalog;

DO $$
DECLARE
    rel regclass;
    who text;
BEGIN
    FOR rel IN SELECT c.oid FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
                WHERE c.relnamespace = 'fanout'::regnamespace AND c.relkind IN ('r', 'p')
                  AND a.attname = 'tenant_id' AND NOT a.attisdropped LOOP
        EXECUTE format('DROP POLICY IF EXISTS fanout_app_all ON %s', rel);
        EXECUTE format('DROP POLICY IF EXISTS fanout_auditor_read ON %s', rel);
        EXECUTE format('DROP POLICY IF EXISTS fanout_tenant_auditor_read ON %s', rel);
        EXECUTE format('ALTER TABLE %s DISABLE ROW LEVEL SECURITY', rel);
        -- The auditors read views only again; fanout_app's own grants stay.
        EXECUTE format('REVOKE SELECT ON %s FROM fanout_auditor, fanout_tenant_auditor', rel);
    END LOOP;
    FOR rel IN SELECT c.oid FROM pg_class c
                WHERE c.relnamespace = 'fanout'::regnamespace AND c.relkind = 'v' LOOP
        EXECUTE format('ALTER VIEW %s RESET (security_invoker)', rel);
        EXECUTE format('REVOKE SELECT ON %s FROM fanout_tenant_auditor', rel);
    END LOOP;
    FOR who IN SELECT DISTINCT r.role_name FROM audit_role r
                 JOIN pg_roles p ON p.rolname = r.role_name LOOP
        EXECUTE format('REVOKE fanout_tenant_auditor FROM %I', who);
        EXECUTE format('REVOKE USAGE ON SCHEMA fanout FROM %I', who);
    END LOOP;
END $$;

CREATE OR REPLACE VIEW task_outcome AS
SELECT t.tenant_id, t.run_id, t.task_id, t.dispatch_index, t.status,
       t.outcome->'summary'->>'error' AS error,
       t.tokens_spent, nullif(t.worker, '') AS worker, t.started_at, t.finished_at
  FROM task t;
CREATE OR REPLACE VIEW tool_calls AS
SELECT tenant_id, run_id, task_id, attempt, iteration, call_index, server, tool, key,
       args_digest, state, nullif(error, '') AS error, octet_length(result) AS result_bytes,
       created_at, resolved_at
  FROM tool_call;
ALTER TABLE task DROP COLUMN outcome_error;
ALTER TABLE tool_call DROP COLUMN result_bytes;

DROP FUNCTION audit_revoke(text, text, text);
DROP FUNCTION audit_grant(text, text, text);
DROP FUNCTION audit_check_role(text);
DROP FUNCTION audit_refresh();
DROP FUNCTION audit_tenants();
DROP TABLE audit_role;
REVOKE USAGE ON SCHEMA fanout FROM fanout_tenant_auditor;
