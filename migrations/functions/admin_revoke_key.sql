-- admin_revoke_key revokes a key as of now() and signals every node on
-- fanout_key_revoked (payload: the key id), in the same transaction. A key
-- already revoked keeps its first revocation: nothing is changed, logged
-- or signalled. An unknown key is no_data_found. It returns revoked_at.
CREATE OR REPLACE FUNCTION admin_revoke_key(p_actor text, p_key_id text) RETURNS timestamptz
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
REVOKE ALL ON FUNCTION admin_revoke_key(text,text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION admin_revoke_key(text,text) TO fanout_admin;
