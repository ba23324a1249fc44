-- name: IssueToolCall :one
SELECT tool_call_issue(@account_id, @key, @tenant_id, @run_id, @task_id, @attempt, @iteration, @call_index,
    @server, @tool, @args_digest, @preview, sqlc.narg('secret')::text)::text AS outcome;

-- name: SendToolCall :one
SELECT tool_call_send(@account_id, @key, @tenant_id, @run_id, @task_id, @attempt, sqlc.narg('secret')::text)::text AS outcome;

-- name: ToolCallIdentity :one
-- The columns that say which call a row is and where it stands: all a
-- worker's login may read of the table.
SELECT key, tenant_id, run_id, task_id, attempt, iteration, call_index, server, tool, args_digest, state,
    created_at, resolved_at, call_id, approval_deadline
FROM tool_call WHERE key = @key;

-- name: ToolCallWrites :many
SELECT key, tenant_id, run_id, task_id, attempt, iteration, call_index, server, tool, args_digest, state,
    created_at, resolved_at, result, error, call_id, preview, approval_deadline
FROM tool_call_writes(@tenant_id, @run_id, @task_id, sqlc.narg('secret')::text);

-- name: PendingToolCalls :many
-- A tenant's calls that wait for approval (of one run, or of all when
-- run_id is empty), oldest first, after the (created_at, call_id) cursor.
SELECT key, tenant_id, run_id, task_id, attempt, iteration, call_index, server, tool, args_digest, state,
    created_at, resolved_at, call_id, preview, approval_deadline
FROM tool_call
WHERE tenant_id = @tenant_id AND state = 'awaiting_approval'
  AND (@run_id::text = '' OR run_id = @run_id)
  AND (created_at, call_id) > (@after_created::timestamptz, @after_call_id::text)
ORDER BY created_at, call_id
LIMIT @max_rows;

-- name: EndRunToolCalls :one
SELECT tool_call_end_run(@run_id)::integer AS denied;
