-- How each task of each run ended: its status, the error its summary
-- reports (NULL if none), the tokens it spent as settled in the ledger, the
-- worker that ran it last and when it started and ended (database time).
CREATE VIEW task_outcome AS
SELECT t.tenant_id, t.run_id, t.task_id, t.dispatch_index, t.status,
       t.outcome_error AS error,
       t.tokens_spent, nullif(t.worker, '') AS worker, t.started_at, t.finished_at
  FROM task t;
GRANT SELECT ON task_outcome TO fanout_app, fanout_auditor;
