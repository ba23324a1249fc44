-- admin_log appends one action; only the admin functions call it, each
-- after its writes and in the same transaction. It checks the actor
-- (admin_check_actor): every admin function is refused, whatever it wrote,
-- under an actor that is not the session's role or a live admin key — the
-- log never names someone who did not act.
CREATE OR REPLACE FUNCTION admin_log(p_actor text, p_action text, p_tenant text, p_detail jsonb) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    PERFORM admin_check_actor(p_actor);
    INSERT INTO admin_action (actor, action, tenant_id, detail)
    VALUES (p_actor, p_action, p_tenant, coalesce(p_detail, '{}'));
END $$;
REVOKE ALL ON FUNCTION admin_log(text,text,text,jsonb) FROM PUBLIC;
