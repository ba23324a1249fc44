CREATE OR REPLACE FUNCTION admin_action_append_only() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'admin_action is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;
REVOKE ALL ON FUNCTION admin_action_append_only() FROM PUBLIC;

CREATE OR REPLACE TRIGGER admin_action_no_truncate BEFORE TRUNCATE ON admin_action
    FOR EACH STATEMENT EXECUTE FUNCTION admin_action_append_only();

CREATE OR REPLACE TRIGGER admin_action_no_update BEFORE UPDATE OR DELETE ON admin_action
    FOR EACH ROW EXECUTE FUNCTION admin_action_append_only();
