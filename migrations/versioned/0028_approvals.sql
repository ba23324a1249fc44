-- 0028: a tool policy the database holds (issue 28; DESIGN §8, §10).
--
-- run_tool_policy is each run's effective tool policy, written by its
-- orchestrator in the transaction that opens the run: which tools the run's
-- tasks may call and which of those need a human's approval, for how long
-- a request may wait. A worker's login reads it and cannot write it.
--
-- A write that needs approval enters tool_call as 'awaiting_approval' with a
-- bounded, secret-free preview of its arguments and a deadline, and moves
-- on only through these transitions (tool_call_transition):
--
--   (insert)          -> issued | awaiting_approval
--   awaiting_approval -> approved | denied      (a decision, an expiry, the run's end)
--   approved          -> issued | denied        (sent by the task's current attempt; the run's end)
--   issued            -> done | failed | unknown | not_sent
--
-- and 'issued' is refused for a call whose run's policy requires approval
-- unless tool_call_decision holds an approval of that call: no code path
-- that skips the wait can send it. tool_call_decision is append-only;
-- only an orchestrator's login records a decision (tool_call_decide), and
-- the deny-only expiry and end-of-run (tool_call_expire), which a worker
-- may also record for the task it holds.
CREATE TABLE fanout.run_tool_policy (
    tenant_id text NOT NULL,
    run_id text NOT NULL,
    tool text NOT NULL CHECK (tool <> '' AND octet_length(tool) <= 256),
    approval boolean NOT NULL,
    approval_timeout_ms bigint NOT NULL CHECK (approval_timeout_ms >= 0),
    CHECK (approval OR approval_timeout_ms = 0),
    PRIMARY KEY (run_id, tool)
);
COMMENT ON TABLE fanout.run_tool_policy IS
    'Each run''s effective tool policy, recorded by its orchestrator when it opens the run: a tool a task may call, and whether its writes wait for an approval (and how long).';

ALTER TABLE fanout.tool_call DROP CONSTRAINT tool_call_state_check;
ALTER TABLE fanout.tool_call ADD CONSTRAINT tool_call_state_check
    CHECK (state IN ('awaiting_approval', 'approved', 'denied', 'issued', 'done', 'failed', 'unknown', 'not_sent'));
ALTER TABLE fanout.tool_call DROP CONSTRAINT tool_call_resolved;
ALTER TABLE fanout.tool_call ADD CONSTRAINT tool_call_resolved
    CHECK ((state IN ('awaiting_approval', 'approved', 'issued')) = (resolved_at IS NULL));
ALTER TABLE fanout.tool_call
    ADD COLUMN call_id text GENERATED ALWAYS AS ('tc_' || md5(key)) STORED,
    ADD COLUMN preview text NOT NULL DEFAULT '' CHECK (octet_length(preview) <= 1024),
    ADD COLUMN approval_deadline timestamptz,
    ADD COLUMN sent_attempt bigint CHECK (sent_attempt >= 1);
ALTER TABLE fanout.tool_call ADD CONSTRAINT tool_call_call_id_key UNIQUE (call_id);
COMMENT ON COLUMN fanout.tool_call.call_id IS 'The call''s id in the API (ApproveToolCall, DenyToolCall): a digest of its key (MD5, as an id: nothing secret).';
COMMENT ON COLUMN fanout.tool_call.preview IS 'The arguments as an approver sees them: bounded, with secret-looking values redacted.';
COMMENT ON COLUMN fanout.tool_call.approval_deadline IS 'When a call that waits for approval is denied unless approved first; NULL for a call that needs none.';
COMMENT ON COLUMN fanout.tool_call.sent_attempt IS 'The attempt that sent the call, when it is not the one that asked for it (a re-dispatched task sending an approved call).';
COMMENT ON TABLE fanout.tool_call IS
    'Tool calls with effect write: recorded before they are sent (issued, or awaiting_approval until a decision), resolved once (done, failed, unknown, not_sent, denied).';
CREATE INDEX tool_call_pending ON fanout.tool_call (tenant_id, approval_deadline) WHERE state = 'awaiting_approval';

CREATE TABLE fanout.tool_call_decision (
    call_id text PRIMARY KEY REFERENCES fanout.tool_call (call_id),
    tenant_id text NOT NULL,
    run_id text NOT NULL,
    decision text NOT NULL CHECK (decision IN ('approved', 'denied')),
    reason text NOT NULL DEFAULT '' CHECK (octet_length(reason) <= 1024),
    actor text NOT NULL CHECK (actor <> '' AND octet_length(actor) <= 256),
    decided_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE fanout.tool_call_decision IS
    'Append-only: who approved or denied a write that waited for approval, when and why (actor fanout for an expiry or the run''s end).';
CREATE INDEX tool_call_decision_tenant ON fanout.tool_call_decision (tenant_id, decided_at);

-- A worker reads which call a row is and where it stands (migration 0024),
-- not its preview (the tenant's content); a denial's reason it reads
-- through tool_call_status, with the secret.
GRANT SELECT (call_id, approval_deadline) ON TABLE fanout.tool_call TO fanout_worker;
GRANT SELECT ON TABLE fanout.run_tool_policy TO fanout_app, fanout_worker;
GRANT INSERT ON TABLE fanout.run_tool_policy TO fanout_app;
GRANT SELECT ON TABLE fanout.tool_call_decision TO fanout_app;

-- The approve scope: ListApprovals, ApproveToolCall, DenyToolCall.
ALTER TABLE fanout.api_key DROP CONSTRAINT api_key_scopes_check;
ALTER TABLE fanout.api_key ADD CONSTRAINT api_key_scopes_check
    CHECK (scopes <@ ARRAY['run', 'read', 'cancel', 'audit', 'approve', 'admin'] AND cardinality(scopes) > 0);
