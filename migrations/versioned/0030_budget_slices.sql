-- 0030: budget slices (issue 43; docs/ledger.md#budget-slices). A task
-- account opened with a slice size holds a slice of its run's budget: its
-- limit_tokens is what was carved for it (counted as reserved on its run
-- and tenant accounts), at most cap_tokens, its cap. A call that fits the
-- slice reserves and settles on the task's row alone (reservation.chain
-- is [task]); a slice runs low, is topped up from the run, in batches of
-- at least slice_size; what it did not use goes back to the run, and what
-- it spent is posted to the run and the tenant (posted), when the task
-- ends, when the run closes, when a sibling needs it (a recall) and when the
-- tenant's period rolls over. Accounts opened without a slice size work as
-- before.
ALTER TABLE fanout.account ADD COLUMN cap_tokens bigint;
ALTER TABLE fanout.account ADD COLUMN slice_size bigint;
ALTER TABLE fanout.account ADD COLUMN posted bigint NOT NULL DEFAULT 0;
ALTER TABLE fanout.account ADD COLUMN slice_until timestamptz;
-- A slice starts empty and may be given back whole.
ALTER TABLE fanout.account DROP CONSTRAINT account_limit_tokens_check;
ALTER TABLE fanout.account ADD CONSTRAINT account_limit_tokens_check
    CHECK (limit_tokens > 0 OR (cap_tokens IS NOT NULL AND limit_tokens >= 0));
ALTER TABLE fanout.account ADD CONSTRAINT account_slice_check CHECK (
    (cap_tokens IS NULL AND slice_size IS NULL AND posted = 0 AND slice_until IS NULL)
    OR (kind = 'task' AND cap_tokens > 0 AND slice_size > 0 AND limit_tokens <= cap_tokens
        AND posted >= 0 AND posted <= spent));
COMMENT ON COLUMN fanout.account.cap_tokens IS
    'Sliced task accounts: the most the task may ever be given (its token_budget); limit_tokens is the slice carved so far. NULL: not sliced.';
COMMENT ON COLUMN fanout.account.slice_size IS
    'Sliced task accounts: the slice carved when an attempt begins, and the least a top-up carves (docs/ledger.md#budget-slices).';
COMMENT ON COLUMN fanout.account.posted IS
    'Sliced task accounts: how much of spent has been posted to the accounts above (the rest counts there as reserved).';
COMMENT ON COLUMN fanout.account.slice_until IS
    'Sliced task accounts: the end of the tenant''s budget period the slice was carved in; after it, a call on the slice locks the chain (and the period rolls over).';

ALTER TABLE fanout.ledger_entry DROP CONSTRAINT ledger_entry_kind_check;
ALTER TABLE fanout.ledger_entry ADD CONSTRAINT ledger_entry_kind_check
    CHECK (kind IN ('open', 'reserve', 'settle', 'void', 'expire', 'exhaust', 'cancel', 'close', 'period', 'adjust',
                    'hold', 'release', 'carve', 'return'));
