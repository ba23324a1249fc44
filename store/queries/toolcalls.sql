-- name: IssueToolCall :one
SELECT tool_call_issue(@account_id, @key, @tenant_id, @run_id, @task_id, @attempt, @iteration, @call_index,
    @server, @tool, @args_digest, sqlc.narg('secret')::text)::text AS outcome;

-- name: ToolCallIdentity :one
-- The columns that say which call a row is and where it stands: all a
-- worker's login may read of the table.
SELECT key, tenant_id, run_id, task_id, attempt, iteration, call_index, server, tool, args_digest, state,
    created_at, resolved_at
FROM tool_call WHERE key = @key;

-- name: ToolCallWrites :many
SELECT key, tenant_id, run_id, task_id, attempt, iteration, call_index, server, tool, args_digest, state,
    created_at, resolved_at, result, error
FROM tool_call_writes(@tenant_id, @run_id, @task_id, sqlc.narg('secret')::text);
