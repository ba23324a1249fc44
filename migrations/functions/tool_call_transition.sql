-- tool_call_transition holds a write tool call to its transitions
-- (migration 0028) and to the approval gate: a call enters as issued or
-- awaiting_approval; awaiting_approval moves to approved or denied,
-- approved to issued or denied, issued to done, failed, unknown or
-- not_sent, once; nothing else changes. A call whose run's recorded policy
-- (run_tool_policy) requires approval becomes approved or issued only if
-- tool_call_decision approves it: whatever function or login writes the
-- row, an unapproved write is never issued (I18). A resolution stamps
-- resolved_at. (NEW.call_id, a generated column, is not computed yet in a
-- BEFORE trigger: the id is computed from the key, as the column is.)
CREATE OR REPLACE FUNCTION tool_call_transition() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state NOT IN ('issued', 'awaiting_approval') THEN
            RAISE EXCEPTION 'tool call %: a call is recorded issued or awaiting_approval, not %', NEW.key, NEW.state
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
    ELSE
        IF NOT (OLD.state = 'awaiting_approval' AND NEW.state IN ('approved', 'denied')
                OR OLD.state = 'approved' AND NEW.state IN ('issued', 'denied')
                OR OLD.state = 'issued' AND NEW.state IN ('done', 'failed', 'unknown', 'not_sent')) THEN
            RAISE EXCEPTION 'tool call % is %: it cannot become % (a write resolves once)', OLD.key, OLD.state, NEW.state
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        IF (NEW.key, NEW.tenant_id, NEW.run_id, NEW.task_id, NEW.attempt, NEW.iteration, NEW.call_index,
            NEW.server, NEW.tool, NEW.args_digest, NEW.created_at, NEW.preview, NEW.approval_deadline)
           IS DISTINCT FROM
           (OLD.key, OLD.tenant_id, OLD.run_id, OLD.task_id, OLD.attempt, OLD.iteration, OLD.call_index,
            OLD.server, OLD.tool, OLD.args_digest, OLD.created_at, OLD.preview, OLD.approval_deadline) THEN
            RAISE EXCEPTION 'tool call %: only its state, result, error and sending attempt change', OLD.key
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
    END IF;
    IF NEW.state IN ('approved', 'issued')
       AND EXISTS (SELECT FROM run_tool_policy p WHERE p.run_id = NEW.run_id AND p.tool = NEW.tool AND p.approval)
       AND NOT EXISTS (SELECT FROM tool_call_decision d WHERE d.call_id = 'tc_' || md5(NEW.key)
                                AND d.decision = 'approved') THEN
        RAISE EXCEPTION 'tool call % (%) needs an approval that was not given: it is not issued', NEW.key, NEW.tool
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.state NOT IN ('awaiting_approval', 'approved', 'issued') THEN
        NEW.resolved_at := now();
    END IF;
    RETURN NEW;
END $$;
REVOKE ALL ON FUNCTION tool_call_transition() FROM PUBLIC;

CREATE OR REPLACE TRIGGER tool_call_transition BEFORE INSERT OR UPDATE ON tool_call
    FOR EACH ROW EXECUTE FUNCTION tool_call_transition();
