-- name: CreateKey :one
SELECT admin_create_key(@actor, @key_id, sqlc.narg('tenant_id')::text, @name, @scopes::text[],
    @secret_sha256, sqlc.narg('requests_per_minute')::int, sqlc.narg('expires_at')::timestamptz)::timestamptz
    AS created_at;

-- name: RevokeKey :exec
SELECT admin_revoke_key(@actor, @key_id);

-- name: ListKeys :many
SELECT key_id, coalesce(tenant_id, '')::text AS tenant_id, name, scopes, requests_per_minute, created_at,
    created_by, expires_at, revoked_at, coalesce(revoked_by, '')::text AS revoked_by
FROM api_key
WHERE @tenant_id::text = '' OR tenant_id = @tenant_id
ORDER BY created_at, key_id;

-- name: Key :one
SELECT key_id, coalesce(tenant_id, '')::text AS tenant_id, name, scopes, requests_per_minute, created_at,
    created_by, expires_at, revoked_at, coalesce(revoked_by, '')::text AS revoked_by
FROM api_key WHERE key_id = @key_id;

-- name: LookupKey :one
SELECT k.key_id, coalesce(k.tenant_id, '')::text AS tenant_id, k.name, k.scopes, k.requests_per_minute,
    k.created_at, k.created_by, k.expires_at, k.revoked_at, coalesce(k.revoked_by, '')::text AS revoked_by,
    k.secret_sha256,
    (k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now()))::bool AS live,
    coalesce(k.requests_per_minute, t.key_requests_per_minute, 0)::int AS effective_requests_per_minute
FROM api_key k LEFT JOIN tenant t USING (tenant_id)
WHERE k.key_id = @key_id;

-- name: KeyStates :many
SELECT id::text AS key_id,
    (k.key_id IS NOT NULL AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now()))::bool AS live,
    coalesce(k.requests_per_minute, t.key_requests_per_minute, 0)::int AS effective_requests_per_minute
FROM unnest(@key_ids::text[]) id
LEFT JOIN api_key k ON k.key_id = id
LEFT JOIN tenant t ON t.tenant_id = k.tenant_id;

-- name: PresentActorSecret :exec
-- The secret the acting key's caller presented, for this transaction only:
-- admin_check_actor and tool_call_decide check it against the key's digest
-- (actor_key_proven). A bind parameter, never the statement's text.
SELECT set_config('fanout.actor_secret', @secret::text, true);
