-- name: Account :one
SELECT account_id, tenant_id, coalesce(parent_id, 0)::bigint AS parent_id, kind,
    coalesce(run_id, '')::text AS run_id, coalesce(task_id, '')::text AS task_id, limit_tokens, reserved, spent,
    min_reservation, state, cause, attempt, closing, held
FROM account WHERE account_id = @account_id;

-- name: RunAccount :one
SELECT account_id, tenant_id, coalesce(parent_id, 0)::bigint AS parent_id, kind,
    coalesce(run_id, '')::text AS run_id, coalesce(task_id, '')::text AS task_id, limit_tokens, reserved, spent,
    min_reservation, state, cause, attempt, closing, held
FROM account WHERE run_id = @run_id::text AND kind = 'run';

-- name: RunAccounts :many
SELECT account_id, tenant_id, coalesce(parent_id, 0)::bigint AS parent_id, kind,
    coalesce(run_id, '')::text AS run_id, coalesce(task_id, '')::text AS task_id, limit_tokens, reserved, spent,
    min_reservation, state, cause, attempt, closing, held
FROM account WHERE run_id = @run_id::text ORDER BY account_id;

-- name: EndRun :one
SELECT account_id, tenant_id, coalesce(parent_id, 0)::bigint AS parent_id, kind,
    coalesce(run_id, '')::text AS run_id, coalesce(task_id, '')::text AS task_id, limit_tokens, reserved, spent,
    min_reservation, state, cause, attempt, closing, held
FROM ledger_end_run(@run_id, @state, @cause);

-- name: EndRunFenced :one
SELECT account_id, tenant_id, coalesce(parent_id, 0)::bigint AS parent_id, kind,
    coalesce(run_id, '')::text AS run_id, coalesce(task_id, '')::text AS task_id, limit_tokens, reserved, spent,
    min_reservation, state, cause, attempt, closing, held
FROM ledger_end_run_fenced(@run_id, @state, @cause, @epoch);

-- name: WindDown :one
SELECT ledger_wind_down(@run_id, @epoch, @task_ids::text[])::bigint AS marked;

-- name: OpenTenant :one
SELECT account_id, tenant_id, coalesce(parent_id, 0)::bigint AS parent_id, kind,
    coalesce(run_id, '')::text AS run_id, coalesce(task_id, '')::text AS task_id, limit_tokens, reserved, spent,
    min_reservation, state, cause, attempt, closing, held
FROM ledger_open_tenant(@tenant_id, @limit_tokens);

-- name: OpenRun :many
SELECT account_id, tenant_id, coalesce(parent_id, 0)::bigint AS parent_id, kind,
    coalesce(run_id, '')::text AS run_id, coalesce(task_id, '')::text AS task_id, limit_tokens, reserved, spent,
    min_reservation, state, cause, attempt, closing, held
FROM ledger_open_run(@run_id, @tenant_id, sqlc.narg('tenant_account')::bigint, @limit_tokens, @min_reservation,
    @task_ids::text[], @task_limits::bigint[], @held);
