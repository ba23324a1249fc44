CREATE VIEW conservation_check AS
SELECT a.tenant_id, a.run_id, a.task_id, a.account_id, a.kind, a.limit_tokens,
       a.limit_tokens - a.reserved - a.spent - a.held AS available_tokens,
       a.reserved AS reserved_tokens, a.spent AS spent_tokens, a.held AS held_tokens,
       coalesce(e.limit_tokens, 0) AS entries_limit,
       coalesce(e.reserved, 0) AS entries_reserved,
       coalesce(e.spent, 0) AS entries_spent,
       coalesce(e.held, 0) AS entries_held,
       a.limit_tokens = coalesce(e.limit_tokens, 0)
         AND a.reserved = coalesce(e.reserved, 0)
         AND a.spent = coalesce(e.spent, 0)
         AND a.held = coalesce(e.held, 0)
         AND a.reserved + a.spent + a.held <= a.limit_tokens
         AND a.reserved = coalesce(h.held, 0) + coalesce(sl.carved, 0)
         AND (a.kind <> 'tenant' OR a.held = coalesce(k.kept, 0)) AS conserved
  FROM account a
  LEFT JOIN (SELECT c.account_id, sum(le.delta_limit) AS limit_tokens,
                    sum(le.delta_reserved) AS reserved, sum(le.delta_spent) AS spent,
                    sum(le.delta_held) AS held
               FROM ledger_entry le CROSS JOIN LATERAL unnest(le.chain) AS c(account_id)
              GROUP BY c.account_id) e USING (account_id)
  LEFT JOIN (SELECT c.account_id, sum(r.amount) AS held
               FROM reservation r CROSS JOIN LATERAL unnest(r.chain) AS c(account_id)
              WHERE r.state = 'held'
              GROUP BY c.account_id) h USING (account_id)
  -- A sliced task's slice counts as reserved on every account above it,
  -- but for what it has posted (docs/ledger.md#budget-slices).
  LEFT JOIN (SELECT s.account_id, sum(s.carved) AS carved
               FROM (SELECT t.parent_id AS account_id, t.limit_tokens - t.posted AS carved
                       FROM account t WHERE t.cap_tokens IS NOT NULL
                     UNION ALL
                     SELECT r.parent_id, t.limit_tokens - t.posted
                       FROM account t JOIN account r ON r.account_id = t.parent_id
                      WHERE t.cap_tokens IS NOT NULL AND r.parent_id IS NOT NULL) s
              GROUP BY s.account_id) sl USING (account_id)
  -- A tenant account holds what its runs hold for their synthesis.
  LEFT JOIN (SELECT parent_id AS account_id, sum(held) AS kept
               FROM account WHERE kind = 'run' AND parent_id IS NOT NULL
              GROUP BY parent_id) k USING (account_id);
GRANT SELECT ON conservation_check TO fanout_app, fanout_worker, fanout_auditor;
