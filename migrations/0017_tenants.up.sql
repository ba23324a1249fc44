-- Tenants as principals (issue 14): their quotas, the API keys fanout issues
-- them, and the append-only log of every administrative action.
--
-- The tenant comes from the caller's credential, never from a request
-- field. A key is a key id plus a secret of 256 bits shown once; only the
-- SHA-256 of the secret is stored, and a node compares it in constant
-- time. A key with no tenant is an admin key: global, and the only kind
-- that manages tenants and keys. Nodes read keys (to authenticate) and
-- tenants (their quotas); every change goes through SECURITY DEFINER
-- functions (later migrations) that append to admin_action in the same
-- transaction, so no change goes unlogged.

SET LOCAL search_path = fanout, pg_catalog;

-- Quotas: NULL is no cap.
ALTER TABLE tenant
    ADD COLUMN max_run_tokens          bigint CHECK (max_run_tokens > 0),
    ADD COLUMN max_concurrent_runs     int    CHECK (max_concurrent_runs >= 0),
    ADD COLUMN max_tasks_in_flight     int    CHECK (max_tasks_in_flight > 0 AND max_tasks_in_flight < 10000),
    ADD COLUMN key_requests_per_minute int    CHECK (key_requests_per_minute > 0),
    ADD COLUMN updated_at              timestamptz NOT NULL DEFAULT now();

COMMENT ON COLUMN tenant.max_run_tokens IS 'The largest budget.limit_tokens one run may ask for; NULL: no cap beyond the server''s.';
COMMENT ON COLUMN tenant.max_concurrent_runs IS 'Runs of the tenant RUNNING at once; counted under the tenant row''s lock. NULL: no cap.';
COMMENT ON COLUMN tenant.max_tasks_in_flight IS 'Tasks of the tenant dispatched at once across the fleet (a store semaphore). NULL: no cap.';
COMMENT ON COLUMN tenant.key_requests_per_minute IS 'The request rate of each key of the tenant that sets none of its own. NULL: no cap.';

CREATE TABLE api_key (
    key_id              text PRIMARY KEY CHECK (key_id ~ '^fk_[0-9a-f]{16}$'),
    -- NULL: an admin key.
    tenant_id           text REFERENCES tenant (tenant_id),
    name                text NOT NULL DEFAULT '' CHECK (octet_length(name) <= 128),
    scopes              text[] NOT NULL
                        CHECK (scopes <@ ARRAY['run', 'read', 'cancel', 'audit', 'admin']
                               AND cardinality(scopes) > 0),
    secret_sha256       bytea NOT NULL CHECK (octet_length(secret_sha256) = 32),
    requests_per_minute int CHECK (requests_per_minute > 0),
    created_at          timestamptz NOT NULL DEFAULT now(),
    created_by          text NOT NULL,
    expires_at          timestamptz,
    revoked_at          timestamptz,
    revoked_by          text,
    CONSTRAINT api_key_admin CHECK ((tenant_id IS NULL) = (scopes = ARRAY['admin'])),
    CONSTRAINT api_key_revoked CHECK ((revoked_at IS NULL) = (revoked_by IS NULL))
);
CREATE INDEX api_key_tenant ON api_key (tenant_id, created_at);

COMMENT ON TABLE api_key IS
    'API keys fanout issued: the secret is kept only as its SHA-256. tenant_id NULL: an admin key.';

CREATE TABLE admin_action (
    action_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    -- who: "key:fk_..." for a call with an admin key, "role:NAME" for the
    -- database role that ran it directly.
    actor     text NOT NULL CHECK (actor <> ''),
    action    text NOT NULL CHECK (action ~ '^[a-z_]+\.[a-z_]+$'),
    tenant_id text,
    -- what: the action's arguments, never a secret.
    detail    jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX admin_action_tenant ON admin_action (tenant_id, at);

CREATE FUNCTION admin_action_append_only() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'admin_action is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER admin_action_no_update BEFORE UPDATE OR DELETE ON admin_action
    FOR EACH ROW EXECUTE FUNCTION admin_action_append_only();
CREATE TRIGGER admin_action_no_truncate BEFORE TRUNCATE ON admin_action
    FOR EACH STATEMENT EXECUTE FUNCTION admin_action_append_only();

-- admin_log appends one action; only the admin functions call it.
CREATE FUNCTION admin_log(p_actor text, p_action text, p_tenant text, p_detail jsonb) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, fanout, pg_temp AS $$
    INSERT INTO admin_action (actor, action, tenant_id, detail)
    VALUES (p_actor, p_action, p_tenant, coalesce(p_detail, '{}'))
$$;
REVOKE ALL ON FUNCTION admin_log(text, text, text, jsonb) FROM PUBLIC;

CREATE VIEW admin_audit AS
SELECT action_id, at, actor, action, tenant_id, detail FROM admin_action;

REVOKE ALL ON api_key, admin_action FROM PUBLIC;
GRANT SELECT ON api_key, admin_action TO fanout_app;
GRANT SELECT ON admin_audit TO fanout_auditor, fanout_app;
