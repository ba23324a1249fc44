-- 0037: continuing a run with more budget (issue 46; docs/budget.md#continue,
-- docs/ledger.md#continuations).
--
-- A run is continued by ledger_continue_run: its limit is raised by the
-- tokens added ('continue' entry) and, when the run had ended
-- BUDGET_EXHAUSTED and its account closed, the run reopens ('reopen'
-- entry): its account and the accounts of the tasks admitted again go back
-- to open, and its synthesis allowance is held again ('hold'). Each
-- continuation is one row here, written in the same transaction, never
-- updated: who added how much, when, why, and what the run had spent then
-- (so that the spend of each continuation can be told apart:
-- run_continuations).
CREATE TABLE fanout.run_continuation (
    run_id          text NOT NULL REFERENCES fanout.run (run_id) ON DELETE CASCADE,
    seq             integer NOT NULL CHECK (seq >= 1),
    tenant_id       text NOT NULL,
    idempotency_key text NOT NULL CHECK (idempotency_key <> '' AND octet_length(idempotency_key) <= 128),
    added_tokens    bigint NOT NULL CHECK (added_tokens > 0),
    limit_after     bigint NOT NULL CHECK (limit_after > added_tokens),
    spent_before    bigint NOT NULL CHECK (spent_before >= 0),
    reopened        boolean NOT NULL,
    task_ids        text[] NOT NULL DEFAULT '{}',
    actor           text NOT NULL CHECK (actor <> ''),
    reason          text NOT NULL DEFAULT '' CHECK (octet_length(reason) <= 1024),
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq),
    CONSTRAINT run_continuation_key UNIQUE (run_id, idempotency_key)
);
COMMENT ON TABLE fanout.run_continuation IS
    'One row per ContinueRun of a run, written by ledger_continue_run with its ledger entries, never updated (docs/budget.md#continue).';
COMMENT ON COLUMN fanout.run_continuation.spent_before IS
    'What the run had spent (its slices'' unposted spend included) when it was continued.';
COMMENT ON COLUMN fanout.run_continuation.task_ids IS
    'The tasks admitted again (NOT_STARTED, and SKIPPED for them) when the run reopened.';
GRANT SELECT ON TABLE fanout.run_continuation TO fanout_app;

ALTER TABLE fanout.ledger_entry DROP CONSTRAINT ledger_entry_kind_check;
ALTER TABLE fanout.ledger_entry ADD CONSTRAINT ledger_entry_kind_check
    CHECK (kind IN ('open', 'reserve', 'settle', 'void', 'expire', 'exhaust', 'cancel', 'close', 'period',
                    'adjust', 'hold', 'release', 'carve', 'return', 'continue', 'reopen'));
COMMENT ON COLUMN fanout.ledger_entry.kind IS
    'open, hold, reserve, settle, void, expire, release, period, adjust, exhaust, cancel, close, carve, return, continue or reopen.';
COMMENT ON COLUMN fanout.account.state IS
    'open, exhausted, cancelled or closed (docs/ledger.md#account-states); closed is terminal but for a continuation (ledger_continue_run), which reopens a run that ended BUDGET_EXHAUSTED.';

-- When the run last reopened: its run timeout counts from then (also for
-- the orchestrator that adopts it).
ALTER TABLE fanout.run ADD COLUMN continued_at timestamptz;
COMMENT ON COLUMN fanout.run.continued_at IS
    'When a ContinueRun last reopened the run (NULL: never); its run timeout counts from then (docs/budget.md#continue).';
