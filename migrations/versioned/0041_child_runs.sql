-- 0041: child runs, the ledger's half of nested fan-out (issue 49;
-- docs/ledger.md#child-runs). A child run is a run whose budget is carved
-- from one task of another run: its account is the root of its own chain
-- (parent_id NULL, like a run without a tenant account), linked under the
-- task by parent_task, and funded by one reservation on that task
-- (funding), which holds the child's whole limit on every account of the
-- task's chain until the child closes and ledger_settle_funding posts what
-- it spent. The checks admit a child run under a task account and nothing
-- else: a parent_task is a run account's, names a task account (the
-- composite key), and comes with exactly one funding reservation, never
-- shared; a child run holds nothing for a synthesis.
CREATE UNIQUE INDEX account_id_kind ON fanout.account (account_id, kind);
ALTER TABLE fanout.account
    ADD COLUMN parent_task bigint,
    ADD COLUMN parent_task_kind text CHECK (parent_task_kind = 'task'),
    ADD COLUMN funding bigint REFERENCES fanout.reservation (reservation_id),
    ADD CONSTRAINT account_parent_task_fkey FOREIGN KEY (parent_task, parent_task_kind)
        REFERENCES fanout.account (account_id, kind),
    ADD CONSTRAINT account_child_run CHECK (
        (parent_task IS NULL AND parent_task_kind IS NULL AND funding IS NULL)
        OR (kind = 'run' AND parent_id IS NULL AND parent_task IS NOT NULL AND parent_task_kind = 'task'
            AND funding IS NOT NULL AND held = 0));
CREATE UNIQUE INDEX account_funding ON fanout.account (funding) WHERE funding IS NOT NULL;
CREATE INDEX account_parent_task ON fanout.account (parent_task) WHERE parent_task IS NOT NULL;
COMMENT ON COLUMN fanout.account.parent_task IS
    'Child runs: the task account the run was carved from (docs/ledger.md#child-runs); its chain starts at itself.';
COMMENT ON COLUMN fanout.account.parent_task_kind IS
    'Child runs: always task, so that the foreign key (parent_task, parent_task_kind) admits a task account and nothing else.';
COMMENT ON COLUMN fanout.account.funding IS
    'Child runs: the reservation on parent_task that holds the child''s limit on every account above it, settled at what the child spent when it closes (ledger_settle_funding).';
