CREATE VIEW admin_audit AS
SELECT action_id, at, actor, action, tenant_id, detail FROM admin_action;
GRANT SELECT ON admin_audit TO fanout_admin, fanout_auditor;
