-- name: GetCachedToolResult :one
-- The live entry of a read call, or NULL (migrations/functions/tool_cache_get.sql).
SELECT tool_cache_get(@account_id, @tenant_id, @run_id, @task_id, sqlc.narg('secret')::text,
    @server, @tool, @args_hash)::jsonb AS result;

-- name: PutCachedToolResult :one
-- Stores a read call's result until now() plus ttl_ms (migrations/functions/tool_cache_put.sql).
SELECT tool_cache_put(@account_id, @tenant_id, @run_id, @task_id, sqlc.narg('secret')::text,
    @server, @tool, @args_hash, @result::jsonb, @ttl_ms::bigint)::boolean AS stored;
