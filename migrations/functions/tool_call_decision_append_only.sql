-- tool_call_decision_append_only keeps the approval log append-only (I12):
-- a decision, once recorded, is never changed or removed.
CREATE OR REPLACE FUNCTION tool_call_decision_append_only() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'tool_call_decision is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;
REVOKE ALL ON FUNCTION tool_call_decision_append_only() FROM PUBLIC;

CREATE OR REPLACE TRIGGER tool_call_decision_no_truncate BEFORE TRUNCATE ON tool_call_decision
    FOR EACH STATEMENT EXECUTE FUNCTION tool_call_decision_append_only();

CREATE OR REPLACE TRIGGER tool_call_decision_no_update BEFORE UPDATE OR DELETE ON tool_call_decision
    FOR EACH ROW EXECUTE FUNCTION tool_call_decision_append_only();
