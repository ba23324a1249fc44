-- 0036: the reads behind concurrency from the rate limits and the priors
-- (review of issue 45; docs/operations.md#concurrency-from-the-rate-limits,
-- docs/budget.md#priors).
--
-- The running runs that share a provider and model's limit: an
-- orchestrator counts them once per provider and model every
-- --concurrency-interval (store.ProviderLimits.RunsNaming). This index holds
-- only the RUNNING runs, keyed by the same expressions the count uses, so
-- that the count reads the runs of one model only, not every running run's
-- spec.
CREATE INDEX run_running_model ON fanout.run
    ((coalesce(spec->'model'->>'provider', '')), (coalesce(spec->'model'->>'model', '')))
    WHERE state = 'RUNNING';

-- A run's tasks are added to its tenant's prior once: the orchestrator that
-- adds them sets this in the same statement, and an adopter that runs the
-- run's end again finds it set (store.Runs.AddTaskPrior).
ALTER TABLE fanout.run ADD COLUMN prior_added boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN fanout.run.prior_added IS
    'The run''s whole tasks were added to its tenant''s prior (task_prior): never twice (docs/budget.md#priors).';
