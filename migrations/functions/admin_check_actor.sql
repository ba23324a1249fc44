-- admin_check_actor raises unless p_actor may act now: the session's own
-- role, a live admin key whose secret this transaction presented
-- (actor_key_proven: a key id alone is not enough), or anonymous where the
-- database opted in.
CREATE OR REPLACE FUNCTION admin_check_actor(p_actor text) RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    IF p_actor IS NULL OR p_actor = '' OR octet_length(p_actor) > 256 THEN
        RAISE EXCEPTION 'actor: must be 1..256 bytes, got %', coalesce(octet_length(p_actor), 0)
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF p_actor = 'anonymous' THEN
        -- Only where the owner opted the database in (`fanout dev`).
        IF NOT EXISTS (SELECT FROM setting WHERE name = 'anonymous_admin' AND value = 'on') THEN
            RAISE EXCEPTION 'actor: anonymous is not allowed in this database (an orchestrator with --auth none; the owner may opt in with fanout.setting anonymous_admin)'
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    ELSIF starts_with(p_actor, 'role:') THEN
        IF p_actor <> 'role:' || session_user THEN
            RAISE EXCEPTION 'actor: % is not the session''s role (role:%)', p_actor, session_user
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    ELSIF starts_with(p_actor, 'key:') THEN
        IF NOT actor_key_proven(p_actor, NULL, 'admin') THEN
            RAISE EXCEPTION 'actor: % is not a live admin key whose secret this call presented (fanout.actor_secret)', p_actor
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    ELSE
        RAISE EXCEPTION 'actor: must be key:ID, role:NAME or anonymous, got %', p_actor
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;
REVOKE ALL ON FUNCTION admin_check_actor(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION admin_check_actor(text) TO fanout_admin;
