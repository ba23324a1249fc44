-- 0027: admission by forecast and wind-down (issue 25; DESIGN §9).
-- A task the run could not afford to its end is never started and says so
-- (NOT_STARTED, distinct from a task the budget cut off). When what a run
-- has left can pay only for final answers, its orchestrator sets
-- account.wind_down on the run's account (ledger_wind_down); every grant
-- on the run then carries it (ledger_result.run_wind_down), and the
-- subagent that asked makes that iteration its last, without tools.
ALTER TABLE fanout.task DROP CONSTRAINT task_status_check;
ALTER TABLE fanout.task ADD CONSTRAINT task_status_check
    CHECK (status = ANY (ARRAY['PENDING', 'RUNNING', 'SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED',
                               'BUDGET_EXHAUSTED', 'ITERATION_LIMIT', 'SKIPPED', 'NOT_STARTED']));

ALTER TABLE fanout.account ADD COLUMN wind_down boolean NOT NULL DEFAULT false;
ALTER TABLE fanout.account ADD CONSTRAINT account_wind_down_check CHECK (NOT wind_down OR kind = 'run');
COMMENT ON COLUMN fanout.account.wind_down IS
    'The run''s orchestrator wound it down: what is left pays only for final answers; every grant on the run says so.';
GRANT SELECT (wind_down) ON fanout.account TO fanout_auditor, fanout_tenant_auditor;

ALTER TYPE fanout.ledger_result ADD ATTRIBUTE run_wind_down boolean;
