-- The only way to change tenants and API keys (issue 14): SECURITY DEFINER
-- functions that fanout_app (a node serving AdminService) and the owner
-- role (`fanout tenant|key ... --database-url`) call. Each validates its
-- arguments (errors name the field and the limit, SQLSTATE 22023), makes
-- the change and appends it to admin_action in the same transaction, so no
-- change goes unlogged. A detail never holds a secret or its digest.
--
-- The actor is checked too: "key:ID" must name an admin key that is live
-- as of now() (a replica whose cache missed a revocation cannot act on it),
-- "role:NAME" must be the session's own login role, and "anonymous" (a node
-- run with --auth none) is taken as said.

SET LOCAL search_path = fanout, pg_catalog;

-- admin_check_actor raises unless p_actor may act now.
CREATE FUNCTION admin_check_actor(p_actor text) RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    IF p_actor IS NULL OR p_actor = '' OR octet_length(p_actor) > 256 THEN
        RAISE EXCEPTION 'actor: must be 1..256 bytes, got %', coalesce(octet_length(p_actor), 0)
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF p_actor = 'anonymous' THEN
        RETURN;
    ELSIF starts_with(p_actor, 'role:') THEN
        IF p_actor <> 'role:' || session_user THEN
            RAISE EXCEPTION 'actor: % is not the session''s role (role:%)', p_actor, session_user
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    ELSIF starts_with(p_actor, 'key:') THEN
        IF NOT EXISTS (SELECT FROM api_key
                        WHERE key_id = substr(p_actor, 5) AND tenant_id IS NULL
                          AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())) THEN
            RAISE EXCEPTION 'actor: % is not a live admin key', p_actor
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    ELSE
        RAISE EXCEPTION 'actor: must be key:ID, role:NAME or anonymous, got %', p_actor
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

-- admin_check_tenant_id raises unless p_tenant is a valid tenant id (the
-- rule of the tenant table and the orchestrator: 1..128 bytes).
CREATE FUNCTION admin_check_tenant_id(p_tenant text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    IF p_tenant IS NULL OR p_tenant = '' OR octet_length(p_tenant) > 128 THEN
        RAISE EXCEPTION 'tenant_id: must be 1..128 bytes, got %', coalesce(octet_length(p_tenant), 0)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

-- admin_check_quotas raises unless the quotas are in the ranges of the
-- tenant table's CHECKs (NULL: no cap).
CREATE FUNCTION admin_check_quotas(p_max_run_tokens bigint, p_max_concurrent_runs int,
                                   p_max_tasks_in_flight int, p_key_requests_per_minute int) RETURNS void
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    IF p_max_run_tokens <= 0 THEN
        RAISE EXCEPTION 'max_run_tokens: must be > 0 (or none), got %', p_max_run_tokens
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF p_max_concurrent_runs < 0 THEN
        RAISE EXCEPTION 'max_concurrent_runs: must be >= 0 (or none), got %', p_max_concurrent_runs
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF p_max_tasks_in_flight <= 0 OR p_max_tasks_in_flight >= 10000 THEN
        RAISE EXCEPTION 'max_tasks_in_flight: must be in 1..9999 (or none), got %', p_max_tasks_in_flight
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF p_key_requests_per_minute <= 0 THEN
        RAISE EXCEPTION 'key_requests_per_minute: must be > 0 (or none), got %', p_key_requests_per_minute
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

-- admin_create_tenant creates a tenant with its quotas. It is not
-- idempotent: a tenant that exists (made by a run before keys existed, or
-- by an earlier create) is unique_violation ("tenant X exists"), so that a
-- create never silently keeps quotas other than the ones asked for; change
-- those with admin_set_quotas.
CREATE FUNCTION admin_create_tenant(p_actor text, p_tenant text, p_max_run_tokens bigint,
                                    p_max_concurrent_runs int, p_max_tasks_in_flight int,
                                    p_key_requests_per_minute int) RETURNS SETOF tenant
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    PERFORM admin_check_actor(p_actor);
    PERFORM admin_check_tenant_id(p_tenant);
    PERFORM admin_check_quotas(p_max_run_tokens, p_max_concurrent_runs, p_max_tasks_in_flight, p_key_requests_per_minute);
    INSERT INTO tenant (tenant_id, max_run_tokens, max_concurrent_runs, max_tasks_in_flight, key_requests_per_minute)
    VALUES (p_tenant, p_max_run_tokens, p_max_concurrent_runs, p_max_tasks_in_flight, p_key_requests_per_minute)
    ON CONFLICT (tenant_id) DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'tenant_id: tenant % exists', p_tenant USING ERRCODE = 'unique_violation';
    END IF;
    PERFORM admin_log(p_actor, 'tenant.create', p_tenant, jsonb_build_object(
        'max_run_tokens', p_max_run_tokens, 'max_concurrent_runs', p_max_concurrent_runs,
        'max_tasks_in_flight', p_max_tasks_in_flight, 'key_requests_per_minute', p_key_requests_per_minute));
    RETURN QUERY SELECT * FROM tenant WHERE tenant_id = p_tenant;
END $$;

-- admin_set_quotas sets all four quotas of a tenant (NULL: no cap). An
-- unknown tenant is no_data_found.
CREATE FUNCTION admin_set_quotas(p_actor text, p_tenant text, p_max_run_tokens bigint,
                                 p_max_concurrent_runs int, p_max_tasks_in_flight int,
                                 p_key_requests_per_minute int) RETURNS SETOF tenant
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    PERFORM admin_check_actor(p_actor);
    PERFORM admin_check_tenant_id(p_tenant);
    PERFORM admin_check_quotas(p_max_run_tokens, p_max_concurrent_runs, p_max_tasks_in_flight, p_key_requests_per_minute);
    UPDATE tenant SET max_run_tokens = p_max_run_tokens, max_concurrent_runs = p_max_concurrent_runs,
                      max_tasks_in_flight = p_max_tasks_in_flight,
                      key_requests_per_minute = p_key_requests_per_minute, updated_at = now()
     WHERE tenant_id = p_tenant;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'tenant_id: tenant % not found', p_tenant USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM admin_log(p_actor, 'tenant.set_quotas', p_tenant, jsonb_build_object(
        'max_run_tokens', p_max_run_tokens, 'max_concurrent_runs', p_max_concurrent_runs,
        'max_tasks_in_flight', p_max_tasks_in_flight, 'key_requests_per_minute', p_key_requests_per_minute));
    RETURN QUERY SELECT * FROM tenant WHERE tenant_id = p_tenant;
END $$;

-- admin_create_key stores a new key: its id, tenant (NULL: an admin key),
-- name, scopes and the SHA-256 of its secret (the secret itself never
-- reaches the database). It returns the key's created_at.
CREATE FUNCTION admin_create_key(p_actor text, p_key_id text, p_tenant text, p_name text, p_scopes text[],
                                 p_secret_sha256 bytea, p_requests_per_minute int,
                                 p_expires_at timestamptz) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    created timestamptz;
    s text;
BEGIN
    PERFORM admin_check_actor(p_actor);
    IF p_key_id IS NULL OR p_key_id !~ '^fk_[0-9a-f]{16}$' THEN
        RAISE EXCEPTION 'key_id: must be fk_ and 16 lowercase hex digits'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_tenant IS NOT NULL THEN
        PERFORM admin_check_tenant_id(p_tenant);
        IF NOT EXISTS (SELECT FROM tenant WHERE tenant_id = p_tenant) THEN
            RAISE EXCEPTION 'tenant_id: tenant % not found', p_tenant USING ERRCODE = 'no_data_found';
        END IF;
    END IF;
    IF octet_length(coalesce(p_name, '')) > 128 THEN
        RAISE EXCEPTION 'name: must be at most 128 bytes, got %', octet_length(p_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_scopes IS NULL OR cardinality(p_scopes) = 0 OR cardinality(p_scopes) > 4 THEN
        RAISE EXCEPTION 'scopes: must hold 1..4 scopes, got %', coalesce(cardinality(p_scopes), 0)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (SELECT count(DISTINCT x) FROM unnest(p_scopes) x) <> cardinality(p_scopes) THEN
        RAISE EXCEPTION 'scopes: must not repeat a scope' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_tenant IS NULL THEN
        IF p_scopes <> ARRAY['admin'] THEN
            RAISE EXCEPTION 'scopes: an admin key (no tenant) holds exactly {admin}'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    ELSE
        FOREACH s IN ARRAY p_scopes LOOP
            IF s IS NULL OR s NOT IN ('run', 'read', 'cancel', 'audit') THEN
                RAISE EXCEPTION 'scopes: a tenant key holds any of run, read, cancel, audit; got %', coalesce(s, 'NULL')
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
        END LOOP;
    END IF;
    IF p_secret_sha256 IS NULL OR octet_length(p_secret_sha256) <> 32 THEN
        RAISE EXCEPTION 'secret_sha256: must be 32 bytes (a SHA-256 digest), got %', coalesce(octet_length(p_secret_sha256), 0)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_requests_per_minute <= 0 THEN
        RAISE EXCEPTION 'requests_per_minute: must be > 0 (or none), got %', p_requests_per_minute
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_expires_at <= now() THEN
        RAISE EXCEPTION 'expires_at: must be after now (%), got %', now(), p_expires_at
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO api_key (key_id, tenant_id, name, scopes, secret_sha256, requests_per_minute, created_by, expires_at)
    VALUES (p_key_id, p_tenant, coalesce(p_name, ''), p_scopes, p_secret_sha256, p_requests_per_minute, p_actor, p_expires_at)
    RETURNING created_at INTO created;
    PERFORM admin_log(p_actor, 'key.create', p_tenant, jsonb_build_object(
        'key_id', p_key_id, 'name', coalesce(p_name, ''), 'scopes', to_jsonb(p_scopes),
        'requests_per_minute', p_requests_per_minute, 'expires_at', p_expires_at));
    RETURN created;
END $$;

-- admin_revoke_key revokes a key as of now() and signals every node on
-- fanout_key_revoked (payload: the key id), in the same transaction. A key
-- already revoked keeps its first revocation: nothing is changed, logged
-- or signalled. An unknown key is no_data_found. It returns revoked_at.
CREATE FUNCTION admin_revoke_key(p_actor text, p_key_id text) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    k api_key;
BEGIN
    PERFORM admin_check_actor(p_actor);
    SELECT * INTO k FROM api_key WHERE key_id = p_key_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'key_id: key % not found', p_key_id USING ERRCODE = 'no_data_found';
    END IF;
    IF k.revoked_at IS NOT NULL THEN
        RETURN k.revoked_at;
    END IF;
    UPDATE api_key SET revoked_at = now(), revoked_by = p_actor WHERE key_id = p_key_id;
    PERFORM admin_log(p_actor, 'key.revoke', k.tenant_id, jsonb_build_object('key_id', p_key_id, 'name', k.name));
    PERFORM pg_notify('fanout_key_revoked', p_key_id);
    RETURN now();
END $$;

REVOKE ALL ON FUNCTION admin_check_actor(text), admin_check_tenant_id(text),
    admin_check_quotas(bigint, int, int, int),
    admin_create_tenant(text, text, bigint, int, int, int),
    admin_set_quotas(text, text, bigint, int, int, int),
    admin_create_key(text, text, text, text, text[], bytea, int, timestamptz),
    admin_revoke_key(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION admin_check_actor(text), admin_check_tenant_id(text),
    admin_check_quotas(bigint, int, int, int),
    admin_create_tenant(text, text, bigint, int, int, int),
    admin_set_quotas(text, text, bigint, int, int, int),
    admin_create_key(text, text, text, text, text[], bytea, int, timestamptz),
    admin_revoke_key(text, text) TO fanout_app;
