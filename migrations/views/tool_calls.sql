-- The auditor's view: every write a subagent asked for, how it ended and
-- when (database time), with the approval it waited for, if any. The
-- result text is not in it: like a task's outcome it is content, read
-- from fanout.tool_call by the owner or a node role; result_bytes says how
-- much there is. The preview is: an approver saw it.
CREATE VIEW tool_calls AS
SELECT tenant_id, run_id, task_id, attempt, iteration, call_index, server, tool, key, call_id,
       args_digest, state, nullif(error, '') AS error, result_bytes, preview, approval_deadline, sent_attempt,
       created_at, resolved_at
  FROM tool_call;
GRANT SELECT ON tool_calls TO fanout_app, fanout_auditor;
