CREATE VIEW task_spend AS
-- limit_tokens is the task's budget (a sliced task's cap); slice_tokens what
-- its slice holds now (NULL: not sliced; docs/ledger.md#budget-slices).
SELECT a.tenant_id, a.run_id, a.task_id, coalesce(a.cap_tokens, a.limit_tokens) AS limit_tokens, a.reserved AS reserved_tokens,
       a.spent AS spent_tokens, a.state,
       coalesce(r.reported, 0) AS reported_tokens, coalesce(r.estimated, 0) AS estimated_tokens,
       coalesce(r.overrun, 0) AS overrun_tokens, coalesce(r.calls, 0) AS reservations,
       CASE WHEN a.cap_tokens IS NOT NULL THEN a.limit_tokens END AS slice_tokens
  FROM account a
  LEFT JOIN (SELECT account_id,
                    sum(spent) FILTER (WHERE NOT estimated) AS reported,
                    sum(spent) FILTER (WHERE estimated) AS estimated,
                    sum(overrun) AS overrun, count(*) AS calls
               FROM reservation GROUP BY account_id) r USING (account_id)
 WHERE a.kind = 'task';
GRANT SELECT ON task_spend TO fanout_app, fanout_auditor;
