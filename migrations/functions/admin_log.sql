-- admin_log appends one action; only the admin functions call it.
CREATE OR REPLACE FUNCTION admin_log(p_actor text, p_action text, p_tenant text, p_detail jsonb) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, fanout, pg_temp AS $$
    INSERT INTO admin_action (actor, action, tenant_id, detail)
    VALUES (p_actor, p_action, p_tenant, coalesce(p_detail, '{}'))
$$;
REVOKE ALL ON FUNCTION admin_log(text,text,text,jsonb) FROM PUBLIC;
