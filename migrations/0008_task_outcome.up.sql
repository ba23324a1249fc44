-- The audit view of how each task of each run ended (issue 11), so that
-- "which tasks failed last week, why, and what they cost" is one query
-- (docs/auditing.md). It reads task.outcome, protojson since 0007.

SET LOCAL search_path = fanout, pg_catalog;

-- How each task of each run ended: its status, the error its summary
-- reports (NULL if none), the tokens it spent as settled in the ledger, the
-- worker that ran it last and when it started and ended (database time).
CREATE VIEW task_outcome AS
SELECT t.tenant_id, t.run_id, t.task_id, t.dispatch_index, t.status,
       t.outcome->'summary'->>'error' AS error,
       t.tokens_spent, nullif(t.worker, '') AS worker, t.started_at, t.finished_at
  FROM task t;

GRANT SELECT ON task_outcome TO fanout_auditor, fanout_app;
