-- name: Account :one
SELECT account_id, tenant_id, coalesce(parent_id, 0)::bigint AS parent_id, kind,
    coalesce(run_id, '')::text AS run_id, coalesce(task_id, '')::text AS task_id, limit_tokens, reserved, spent,
    min_reservation, state, cause, attempt, closing, held
FROM account WHERE account_id = @account_id;

-- name: RunAccount :one
-- What its tasks' slices spent counts as spent, posted or not, and what
-- they hold that no call reserved is said apart (docs/ledger.md#budget-slices).
SELECT a.account_id, a.tenant_id, coalesce(a.parent_id, 0)::bigint AS parent_id, a.kind,
    coalesce(a.run_id, '')::text AS run_id, coalesce(a.task_id, '')::text AS task_id, a.limit_tokens,
    (a.reserved - coalesce(u.unposted, 0))::bigint AS reserved, (a.spent + coalesce(u.unposted, 0))::bigint AS spent,
    a.min_reservation, a.state, a.cause, a.attempt, a.closing, a.held, coalesce(u.unused, 0)::bigint AS sliced
FROM account a
LEFT JOIN LATERAL (SELECT sum(t.spent - t.posted) AS unposted, sum(t.limit_tokens - t.reserved - t.spent) AS unused
                     FROM account t WHERE t.parent_id = a.account_id AND t.kind = 'task' AND t.cap_tokens IS NOT NULL) u ON true
WHERE a.run_id = @run_id::text AND a.kind = 'run';

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
    @task_ids::text[], @task_limits::bigint[], @held, @task_slices::bigint[]);
