-- tenant_budget: each tenant account's budget as of now, as if the period
-- had rolled over when its end has passed (the roll itself waits for the
-- next statement that locks the account).
CREATE VIEW tenant_budget AS
SELECT a.tenant_id, a.account_id, a.period_kind, a.period_every, a.period_limit, a.min_reservation,
       -- What its runs' task slices spent counts as spent here before it
       -- is posted (docs/ledger.md#budget-slices).
       (a.reserved - coalesce(u.unposted, 0))::bigint AS reserved_tokens, (a.spent + coalesce(u.unposted, 0))::bigint AS spent_tokens,
       CASE WHEN due THEN greatest(a.spent + a.period_limit, a.spent + a.reserved + a.held) ELSE a.limit_tokens END AS limit_tokens,
       CASE WHEN due THEN 0 ELSE (a.spent + coalesce(u.unposted, 0) - a.period_base)::bigint END AS period_spent_tokens,
       CASE WHEN due THEN ledger_period_next_end(a.period_kind, a.period_every, a.period_end, now())
            ELSE a.period_end END AS period_end,
       a.state, a.created_at, a.updated_at, a.held AS held_tokens
  FROM account a CROSS JOIN LATERAL (SELECT a.period_end IS NOT NULL AND now() >= a.period_end AS due) d
  LEFT JOIN (SELECT r.parent_id AS account_id, sum(t.spent - t.posted) AS unposted
               FROM account t JOIN account r ON r.account_id = t.parent_id
              WHERE t.kind = 'task' AND t.cap_tokens IS NOT NULL AND r.parent_id IS NOT NULL
              GROUP BY r.parent_id) u USING (account_id)
 WHERE a.kind = 'tenant';
GRANT SELECT ON tenant_budget TO fanout_app, fanout_admin, fanout_auditor;
