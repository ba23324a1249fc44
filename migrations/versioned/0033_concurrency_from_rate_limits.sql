-- 0033: concurrency from the rate limits (issue 45;
-- docs/operations.md#concurrency-from-the-rate-limits). A tenant's headroom: the share of a
-- stated limit its runs that leave max_concurrency unset plan to use when
-- the orchestrator sizes their concurrency. NULL: the server's default
-- (0.7). Set with the quotas (admin_set_quotas, `fanout tenant set-quotas --headroom`).
ALTER TABLE fanout.tenant ADD COLUMN headroom double precision
    CONSTRAINT tenant_headroom_check CHECK (headroom > 0 AND headroom <= 1);
COMMENT ON COLUMN fanout.tenant.headroom IS
    'The share (0 < h <= 1) of a provider''s stated rate limit the tenant''s runs plan to use when their concurrency is sized from it (docs/operations.md#concurrency-from-the-rate-limits). NULL: the server''s default, 0.7.';

-- GetRun shows a run's latest ConcurrencyChosen (Run.concurrency): this
-- index holds only those events, so that the read does not walk a large
-- run's whole log (store.Runs.LastConcurrency).
CREATE INDEX run_event_concurrency_chosen ON fanout.run_event (run_id, sequence DESC)
    WHERE event ? 'concurrency_chosen';
