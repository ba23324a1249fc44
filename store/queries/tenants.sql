-- name: CreateTenant :one
SELECT * FROM admin_create_tenant(@actor, @tenant_id, sqlc.narg('max_run_tokens')::bigint,
    sqlc.narg('max_concurrent_runs')::int, sqlc.narg('max_tasks_in_flight')::int,
    sqlc.narg('key_requests_per_minute')::int, sqlc.narg('headroom')::float8);

-- name: SetQuotas :one
SELECT * FROM admin_set_quotas(@actor, @tenant_id, sqlc.narg('max_run_tokens')::bigint,
    sqlc.narg('max_concurrent_runs')::int, sqlc.narg('max_tasks_in_flight')::int,
    sqlc.narg('key_requests_per_minute')::int, sqlc.narg('headroom')::float8);

-- name: Tenant :one
SELECT * FROM tenant WHERE tenant_id = @tenant_id;

-- name: SetTenantBudget :one
SELECT account_id FROM ledger_set_tenant_budget(@actor, @tenant_id, @limit_tokens, @period_kind,
    sqlc.narg('period_every')::interval, sqlc.narg('min_reservation')::bigint);

-- name: TenantBudget :one
SELECT account_id, tenant_id, limit_tokens::bigint AS limit_tokens, reserved_tokens, spent_tokens,
    min_reservation, state, period_kind,
    coalesce(extract(epoch FROM period_every), 0)::float8 AS period_every_seconds,
    period_limit, period_end, period_spent_tokens::bigint AS period_spent_tokens, held_tokens
FROM tenant_budget WHERE tenant_id = @tenant_id;
