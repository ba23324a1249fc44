-- 0039: reuse of a task's recorded facts (issue 46; docs/budget.md#fork,
-- docs/budget.md#the-result-cache). A task's content key is the SHA-256
-- (hex) of what it is asked: its instruction, its tools, the run's goal
-- and model, and its dependencies' keys; the orchestrator computes it from
-- the plan and stores it when the run opens. A task that reused another's
-- facts is stored without one: the cache's source is always a task that
-- ran.
ALTER TABLE fanout.task ADD COLUMN content_key text;
ALTER TABLE fanout.task ADD CONSTRAINT task_content_key_check CHECK (content_key ~ '^[0-9a-f]{64}$');
COMMENT ON COLUMN fanout.task.content_key IS
    'SHA-256 (hex) of the task''s content (docs/budget.md#the-result-cache); NULL for a task that reused another''s facts, and for tasks of runs opened before 0039.';

-- The result cache's lookup: a tenant's newest SUCCEEDED task with a key
-- (store.Runs.CachedTasks).
CREATE INDEX task_cache ON fanout.task (tenant_id, content_key, finished_at DESC)
    WHERE status = 'SUCCEEDED' AND content_key IS NOT NULL;

-- The run a run was forked from (ForkRun; Run.forked_from).
ALTER TABLE fanout.run ADD COLUMN forked_from text;
ALTER TABLE fanout.run ADD CONSTRAINT run_forked_from_check CHECK (forked_from <> '');
COMMENT ON COLUMN fanout.run.forked_from IS
    'The run this run was forked from (ForkRun, docs/budget.md#fork); NULL for a run that was not.';
