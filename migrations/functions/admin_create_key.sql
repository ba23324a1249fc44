-- admin_create_key stores a new key: its id, tenant (NULL: an admin key),
-- name, scopes and the SHA-256 of its secret (the secret itself never
-- reaches the database). It returns the key's created_at.
CREATE OR REPLACE FUNCTION admin_create_key(p_actor text, p_key_id text, p_tenant text, p_name text, p_scopes text[],
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
    IF p_scopes IS NULL OR cardinality(p_scopes) = 0 OR cardinality(p_scopes) > 5 THEN
        RAISE EXCEPTION 'scopes: must hold 1..5 scopes, got %', coalesce(cardinality(p_scopes), 0)
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
            IF s IS NULL OR s NOT IN ('run', 'read', 'cancel', 'audit', 'approve') THEN
                RAISE EXCEPTION 'scopes: a tenant key holds any of run, read, cancel, audit, approve; got %', coalesce(s, 'NULL')
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
REVOKE ALL ON FUNCTION admin_create_key(text,text,text,text,text[],bytea,integer,timestamp with time zone) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION admin_create_key(text,text,text,text,text[],bytea,integer,timestamp with time zone) TO fanout_admin;
