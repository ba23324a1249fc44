-- run_continuations (file run_spend_continuations.sql: it reads run_spend, so it sorts after it) itemises a run's continuations (docs/budget.md#continue):
-- each one's tokens added, the run's budget after it, what the run had
-- spent before it, and what was spent from it until the next one (or, for
-- the last, until now: the run's spend as run_spend counts it).
CREATE VIEW run_continuations AS
SELECT c.tenant_id, c.run_id, c.seq AS continuation, c.added_tokens, c.limit_after AS limit_tokens,
       c.spent_before AS spent_before_tokens,
       coalesce(lead(c.spent_before) OVER w, s.spent_tokens, c.spent_before) - c.spent_before AS spent_tokens,
       c.reopened, c.task_ids, c.actor, c.reason, c.created_at
  FROM run_continuation c
  LEFT JOIN run_spend s USING (run_id)
WINDOW w AS (PARTITION BY c.run_id ORDER BY c.seq);
GRANT SELECT ON run_continuations TO fanout_app, fanout_auditor;
