-- Who decided on each write that waited for approval, when, what and why:
-- a person's key (key:ID) through ApproveToolCall or DenyToolCall, or
-- fanout itself for an approval that expired or a run that ended first.
CREATE VIEW tool_call_decisions AS
SELECT d.tenant_id, d.run_id, c.task_id, c.tool, d.call_id, d.decision, d.reason, d.actor, d.decided_at,
       c.created_at AS requested_at, c.approval_deadline, c.preview, c.state AS call_state
  FROM tool_call_decision d
  JOIN tool_call c ON c.call_id = d.call_id;
GRANT SELECT ON tool_call_decisions TO fanout_app, fanout_auditor;
