-- 0027: admission by forecast and wind-down (issue 25; DESIGN §9).
-- A task the run could not afford to its end is never started and says so
-- (NOT_STARTED, distinct from a task the budget cut off). When what a run
-- has left can pay only for final answers, its orchestrator sets
-- account.wind_down on the accounts of the tasks in flight
-- (ledger_wind_down); every grant on such an account carries it
-- (ledger_result.wind_down), and the subagent that asked makes that
-- iteration its last, without tools. Tasks started later are not marked.
ALTER TABLE fanout.task DROP CONSTRAINT task_status_check;
ALTER TABLE fanout.task ADD CONSTRAINT task_status_check
    CHECK (status = ANY (ARRAY['PENDING', 'RUNNING', 'SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED',
                               'BUDGET_EXHAUSTED', 'ITERATION_LIMIT', 'SKIPPED', 'NOT_STARTED']));

ALTER TABLE fanout.account ADD COLUMN wind_down boolean NOT NULL DEFAULT false;
ALTER TABLE fanout.account ADD CONSTRAINT account_wind_down_check CHECK (NOT wind_down OR kind = 'task');
COMMENT ON COLUMN fanout.account.wind_down IS
    'The run''s orchestrator wound this task down: what is left pays only for final answers; every grant on it says so.';

ALTER TYPE fanout.ledger_result ADD ATTRIBUTE wind_down boolean;
