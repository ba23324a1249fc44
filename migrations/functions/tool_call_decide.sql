-- tool_call_decide records p_actor's decision (approved or denied, with
-- p_reason) on the write tool call p_call_id of tenant p_tenant that waits
-- for approval, in tool_call_decision, and moves the call to approved or
-- denied. Only an orchestrator's login decides (the API's ApproveToolCall
-- and DenyToolCall, which check the caller's scope). The actor is one the
-- database can trust: "anonymous" (an orchestrator with --auth none: it
-- names no one), the session's own role ("role:" and the login), or a live
-- key of the tenant holding approve whose secret this transaction
-- presented (actor_key_proven) — never a key id alone, nor "fanout" (the
-- decisions fanout makes itself). The schema's owner is not asked: it owns
-- tool_call_decision. A call past its
-- deadline is denied as expired instead, and one of a run whose ledger
-- account is no longer open (exhausted, cancelled, closed) as "run ended".
-- The same decision again is a no-op. Returns the outcome (decided, same: already so decided,
-- conflict: already decided otherwise, expired, run_ended, not_found,
-- not_waiting: it never waited for approval) and the call's row.
CREATE OR REPLACE FUNCTION tool_call_decide(p_tenant text, p_call_id text, p_decision text, p_actor text, p_reason text)
RETURNS TABLE (outcome text, decision text, actor text, reason text, decided_at timestamptz, run_id text, task_id text,
               tool text, state text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
#variable_conflict use_column
DECLARE
    c tool_call;
    d tool_call_decision;
    why text;
BEGIN
    IF NOT session_is_orchestrator() THEN
        RAISE EXCEPTION 'tool_call_decide: only an orchestrator''s login records a decision'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_decision IS NULL OR p_decision NOT IN ('approved', 'denied') THEN
        RAISE EXCEPTION 'decision: must be approved or denied, got %', coalesce(p_decision, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF octet_length(coalesce(p_reason, '')) > 1024 THEN
        RAISE EXCEPTION 'reason: must be at most 1024 bytes, got %', octet_length(p_reason)
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF coalesce(p_actor, '') = '' OR octet_length(p_actor) > 256 THEN
        RAISE EXCEPTION 'actor: must be 1 to 256 bytes' USING ERRCODE = 'invalid_parameter_value';
    ELSIF NOT (p_actor = 'anonymous' OR p_actor = 'role:' || session_user
               OR actor_key_proven(p_actor, p_tenant, 'approve')
               OR pg_has_role(session_user, (SELECT nspowner FROM pg_namespace WHERE nspname = 'fanout'), 'USAGE')) THEN
        RAISE EXCEPTION 'actor: % is not anonymous, the session''s role (role:%) or a live approve key of tenant % whose secret this call presented (fanout.actor_secret)',
            p_actor, session_user, p_tenant USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT * INTO c FROM tool_call WHERE call_id = p_call_id AND tenant_id = p_tenant FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::text, NULL::text, NULL::text, NULL::timestamptz,
                            NULL::text, NULL::text, NULL::text, NULL::text;
        RETURN;
    END IF;
    SELECT * INTO d FROM tool_call_decision WHERE call_id = p_call_id;
    IF FOUND THEN
        RETURN QUERY SELECT CASE WHEN d.decision = p_decision THEN 'same' ELSE 'conflict' END,
                            d.decision, d.actor, d.reason, d.decided_at, c.run_id, c.task_id, c.tool, c.state;
        RETURN;
    ELSIF c.state <> 'awaiting_approval' THEN
        RETURN QUERY SELECT 'not_waiting'::text, NULL::text, NULL::text, NULL::text, NULL::timestamptz,
                            c.run_id, c.task_id, c.tool, c.state;
        RETURN;
    END IF;
    IF (SELECT r.state FROM account r WHERE r.run_id = c.run_id AND r.kind = 'run') IS DISTINCT FROM 'open' THEN
        INSERT INTO tool_call_decision (call_id, tenant_id, run_id, decision, reason, actor)
        VALUES (p_call_id, c.tenant_id, c.run_id, 'denied', 'run ended', 'fanout') RETURNING * INTO d;
        UPDATE tool_call SET state = 'denied', error = 'denied: run ended' WHERE key = c.key;
        RETURN QUERY SELECT 'run_ended'::text, d.decision, d.actor, d.reason, d.decided_at, c.run_id, c.task_id, c.tool,
                            'denied'::text;
        RETURN;
    END IF;
    IF now() >= c.approval_deadline THEN
        INSERT INTO tool_call_decision (call_id, tenant_id, run_id, decision, reason, actor)
        VALUES (p_call_id, c.tenant_id, c.run_id, 'denied', 'expired', 'fanout') RETURNING * INTO d;
        UPDATE tool_call SET state = 'denied', error = 'denied: the approval expired' WHERE key = c.key;
        RETURN QUERY SELECT 'expired'::text, d.decision, d.actor, d.reason, d.decided_at, c.run_id, c.task_id, c.tool,
                            'denied'::text;
        RETURN;
    END IF;
    INSERT INTO tool_call_decision (call_id, tenant_id, run_id, decision, reason, actor)
    VALUES (p_call_id, c.tenant_id, c.run_id, p_decision, coalesce(p_reason, ''), p_actor) RETURNING * INTO d;
    why := CASE WHEN p_decision = 'denied'
                THEN format('denied by %s: %s', p_actor, coalesce(nullif(p_reason, ''), 'no reason given')) ELSE '' END;
    UPDATE tool_call SET state = p_decision, error = why WHERE key = c.key;
    RETURN QUERY SELECT 'decided'::text, d.decision, d.actor, d.reason, d.decided_at, c.run_id, c.task_id, c.tool,
                        p_decision;
END $$;
REVOKE ALL ON FUNCTION tool_call_decide(text,text,text,text,text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tool_call_decide(text,text,text,text,text) TO fanout_app;
