-- tool_call_resolve_once refuses every UPDATE but the one resolution of an
-- issued call, and stamps its time.
CREATE OR REPLACE FUNCTION tool_call_resolve_once() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    IF OLD.state <> 'issued' THEN
        RAISE EXCEPTION 'tool call % is already %: a write resolves once', OLD.key, OLD.state
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.state = 'issued' THEN
        RAISE EXCEPTION 'tool call %: an update must resolve it (done, failed, unknown or not_sent)', OLD.key
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF (NEW.key, NEW.tenant_id, NEW.run_id, NEW.task_id, NEW.attempt, NEW.iteration, NEW.call_index,
        NEW.server, NEW.tool, NEW.args_digest, NEW.created_at)
       IS DISTINCT FROM
       (OLD.key, OLD.tenant_id, OLD.run_id, OLD.task_id, OLD.attempt, OLD.iteration, OLD.call_index,
        OLD.server, OLD.tool, OLD.args_digest, OLD.created_at) THEN
        RAISE EXCEPTION 'tool call %: only state, result and error change, once', OLD.key
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    NEW.resolved_at := now();
    RETURN NEW;
END $$;
REVOKE ALL ON FUNCTION tool_call_resolve_once() FROM PUBLIC;

CREATE OR REPLACE TRIGGER tool_call_resolve_once BEFORE UPDATE ON tool_call
    FOR EACH ROW EXECUTE FUNCTION tool_call_resolve_once();
