-- 0025: a write that never reached its tool is a state of its own,
-- 'not_sent', no longer 'failed' with an error text that starts "not sent: "
-- (which a reader had to take apart with a prefix test). A later attempt
-- of the task may make it; an auditor counts it as nothing that happened.
-- Rows written before move over, their error text without the prefix; the
-- resolve-once trigger (on an upgraded database; a new one has it only
-- once the definitions run) is off for that one statement, since it
-- refuses any change of a resolved call.
ALTER TABLE fanout.tool_call DROP CONSTRAINT tool_call_state_check;
ALTER TABLE fanout.tool_call ADD CONSTRAINT tool_call_state_check
    CHECK (state IN ('issued', 'done', 'failed', 'unknown', 'not_sent'));
ALTER TABLE fanout.tool_call DISABLE TRIGGER USER; -- tool_call_resolve_once, on a database upgraded
UPDATE fanout.tool_call SET state = 'not_sent', error = substr(error, length('not sent: ') + 1)
 WHERE state = 'failed' AND error LIKE 'not sent: %';
ALTER TABLE fanout.tool_call ENABLE TRIGGER USER;
