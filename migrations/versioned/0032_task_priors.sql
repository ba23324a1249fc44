-- 0032: priors of admission by forecast (issue 45; docs/budget.md#priors).
-- What tasks of a tenant cost with a model in its earlier runs: how many
-- whole tasks ran to an answer (not wound down), and what they spent and
-- needed at their peak in all. Read once when a run starts, so that its
-- first tasks are forecast from them rather than from their token_budget;
-- added to when a run's tasks have ended. Keyed by tenant: one tenant's
-- spend never forecasts another's. Written by orchestrators only.
CREATE TABLE fanout.task_prior (
    tenant_id  text NOT NULL,
    model      text NOT NULL,
    tasks      bigint NOT NULL CHECK (tasks > 0),
    spent      bigint NOT NULL CHECK (spent >= 0),
    peak       bigint NOT NULL CHECK (peak >= spent),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, model)
);
COMMENT ON TABLE fanout.task_prior IS
    'What whole tasks of a tenant spent with a model in its earlier runs (sums over tasks): the forecast of a run''s first tasks.';
GRANT SELECT, INSERT, UPDATE ON TABLE fanout.task_prior TO fanout_app;
