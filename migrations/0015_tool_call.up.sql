-- Tool calls with effect write, recorded before they are sent (issue 13).
--
-- A subagent writes a tool_call row (state issued) before it sends a write
-- to its tool, with the idempotency key it puts in the call's _meta, and
-- resolves it once when the call ends: done, failed, or unknown (cut off:
-- it may have happened). A later attempt of the task reads its earlier
-- attempts' writes and never sends again one that was issued. Arguments are
-- kept only as a SHA-256 digest; no secrets are stored.
--
-- History cannot be rewritten: a trigger lets an UPDATE do nothing but move
-- an issued row to one of the other states, once (for every role, the owner
-- too), and stamps resolved_at from the database's clock. Nodes (fanout_app)
-- may insert the call's identity only (its state starts issued), update only
-- the state, result and error, and never delete.

SET LOCAL search_path = fanout, pg_catalog;

CREATE TABLE tool_call (
    key         text PRIMARY KEY CHECK (key <> '' AND octet_length(key) <= 256),
    tenant_id   text NOT NULL CHECK (tenant_id <> '' AND octet_length(tenant_id) <= 128),
    run_id      text NOT NULL CHECK (run_id <> ''),
    task_id     text NOT NULL CHECK (task_id <> '' AND octet_length(task_id) <= 64),
    attempt     bigint NOT NULL CHECK (attempt >= 1),
    iteration   int NOT NULL CHECK (iteration >= 0),
    call_index  int NOT NULL CHECK (call_index >= 0),
    server      text NOT NULL DEFAULT '' CHECK (octet_length(server) <= 256),
    tool        text NOT NULL CHECK (tool <> '' AND octet_length(tool) <= 256),
    args_digest text NOT NULL CHECK (args_digest ~ '^[0-9a-f]{64}$'),
    state       text NOT NULL DEFAULT 'issued' CHECK (state IN ('issued', 'done', 'failed', 'unknown')),
    result      text NOT NULL DEFAULT '',
    error       text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    resolved_at timestamptz,
    CONSTRAINT tool_call_resolved CHECK ((state = 'issued') = (resolved_at IS NULL))
);
CREATE INDEX tool_call_task ON tool_call (tenant_id, run_id, task_id, created_at);

COMMENT ON TABLE tool_call IS
    'Tool calls with effect write, recorded issued before they are sent and resolved once (done, failed, unknown).';
COMMENT ON COLUMN tool_call.key IS 'The idempotency key sent in the call''s _meta.';
COMMENT ON COLUMN tool_call.args_digest IS 'Hex SHA-256 of the call''s JSON arguments as the model sent them.';
COMMENT ON COLUMN tool_call.result IS 'A resolved write''s result as the model was shown it.';

-- tool_call_resolve_once refuses every UPDATE but the one resolution of an
-- issued call, and stamps its time.
CREATE FUNCTION tool_call_resolve_once() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    IF OLD.state <> 'issued' THEN
        RAISE EXCEPTION 'tool call % is already %: a write resolves once', OLD.key, OLD.state
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.state = 'issued' THEN
        RAISE EXCEPTION 'tool call %: an update must resolve it (done, failed or unknown)', OLD.key
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
CREATE TRIGGER tool_call_resolve_once BEFORE UPDATE ON tool_call
    FOR EACH ROW EXECUTE FUNCTION tool_call_resolve_once();
REVOKE ALL ON FUNCTION tool_call_resolve_once() FROM PUBLIC;

-- The auditor's view: every write a subagent issued, how it ended and
-- when (database time). The result text is not in it: like a task's
-- outcome it is content, read from fanout.tool_call by the owner or a node
-- role; result_bytes says how much there is.
CREATE VIEW tool_calls AS
SELECT tenant_id, run_id, task_id, attempt, iteration, call_index, server, tool, key,
       args_digest, state, nullif(error, '') AS error, octet_length(result) AS result_bytes,
       created_at, resolved_at
  FROM tool_call;

REVOKE ALL ON tool_call FROM fanout_app, fanout_auditor;
GRANT SELECT ON tool_call TO fanout_app;
GRANT INSERT (key, tenant_id, run_id, task_id, attempt, iteration, call_index, server, tool, args_digest)
    ON tool_call TO fanout_app;
GRANT UPDATE (state, result, error) ON tool_call TO fanout_app;
GRANT SELECT ON tool_calls TO fanout_auditor, fanout_app;
