-- actor_key_proven says whether p_actor is 'key:ID' of a live key (not
-- revoked, not expired) of tenant p_tenant (NULL: an admin key) holding
-- p_scope, whose secret this transaction presented: the setting
-- fanout.actor_secret, which the process sets for its transaction only
-- (set_config(..., true), as a bind parameter) to the secret its caller
-- sent with the key, hashes to the key's stored digest. A live key id
-- alone proves nothing: every process login reads the ids, and the
-- orchestrator's and AdminService's logins the digests too; only whoever
-- holds the key, or sees it in flight, has its secret. Only the admin
-- functions and tool_call_decide call it (as the owner); it never names
-- the secret.
CREATE OR REPLACE FUNCTION actor_key_proven(p_actor text, p_tenant text, p_scope text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, fanout, pg_temp AS $$
    SELECT EXISTS (
        SELECT FROM api_key k
         WHERE starts_with(p_actor, 'key:') AND k.key_id = substr(p_actor, 5)
           AND k.tenant_id IS NOT DISTINCT FROM p_tenant AND p_scope = ANY (k.scopes)
           AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now())
           AND coalesce(current_setting('fanout.actor_secret', true), '') <> ''
           AND k.secret_sha256 = sha256(convert_to(current_setting('fanout.actor_secret', true), 'UTF8')))
$$;
REVOKE ALL ON FUNCTION actor_key_proven(text,text,text) FROM PUBLIC;
