-- 0042: nested fan-out, the engine's half (issue 49; docs/budget.md#nested-fan-out).
-- A child run (a subagent's fan_out call) records the run, task and
-- tool call that started it, and the root of its tree, so that the tree's
-- limits (RunSpec.fan_out) are counted in the database by whichever
-- orchestrator opens the next child, and a child's end answers the call
-- its parent waits on. The ledger's half (0041) ties the child's account
-- to the parent task's; these columns are the run's side of the same tree.
ALTER TABLE fanout.run ADD COLUMN parent_run_id text REFERENCES fanout.run (run_id);
ALTER TABLE fanout.run ADD COLUMN parent_task_id text;
ALTER TABLE fanout.run ADD COLUMN parent_call text;
ALTER TABLE fanout.run ADD COLUMN root_run_id text REFERENCES fanout.run (run_id);
ALTER TABLE fanout.run ADD COLUMN depth integer NOT NULL DEFAULT 0;
ALTER TABLE fanout.run ADD CONSTRAINT run_child CHECK (
    (parent_run_id IS NULL AND parent_task_id IS NULL AND parent_call IS NULL AND root_run_id IS NULL AND depth = 0)
    OR (parent_run_id IS NOT NULL AND parent_task_id IS NOT NULL AND parent_call IS NOT NULL
        AND root_run_id IS NOT NULL AND depth BETWEEN 1 AND 4));
CREATE INDEX run_root ON fanout.run (root_run_id) WHERE root_run_id IS NOT NULL;
COMMENT ON COLUMN fanout.run.parent_run_id IS
    'For a child run (docs/budget.md#nested-fan-out): the run whose task started it; NULL for a run a caller started.';
COMMENT ON COLUMN fanout.run.parent_task_id IS 'For a child run: the task whose fan_out call started it.';
COMMENT ON COLUMN fanout.run.parent_call IS
    'For a child run: the key of the fan_out tool_call row its end answers with its joined facts.';
COMMENT ON COLUMN fanout.run.root_run_id IS 'For a child run: the root run of its tree; NULL for a root run.';
COMMENT ON COLUMN fanout.run.depth IS 'How many levels below its root the run is: 0 for a root run, at most 4.';
