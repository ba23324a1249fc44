-- money_line: each spend entry (settle, expire) priced at the price of its
-- model in effect at its created_at (of rows from one instant, the latest
-- set: a correction). A child run's funding is not a model call: its
-- settle posts the child's calls, priced on the child's own lines, so it
-- is left out (docs/ledger.md#child-runs).
CREATE VIEW money_line AS
SELECT le.entry_id, le.tenant_id, le.run_id, le.task_id, le.kind, le.created_at, le.model,
       le.input_tokens, le.output_tokens, le.estimated,
       coalesce(le.actual, le.delta_spent) AS tokens,
       le.input_tokens IS NULL AS worst_case,
       p.effective_from AS price_from, p.currency,
       CASE WHEN p.model IS NULL THEN NULL
            WHEN le.input_tokens IS NOT NULL
                 THEN (le.input_tokens * p.input_per_million + le.output_tokens * p.output_per_million) / 1000000
            ELSE coalesce(le.actual, le.delta_spent) * greatest(p.input_per_million, p.output_per_million) / 1000000
       END AS cost
  FROM ledger_entry le
  LEFT JOIN LATERAL (SELECT * FROM price pr
                      WHERE pr.model = le.model AND pr.effective_from <= le.created_at
                      ORDER BY pr.effective_from DESC, pr.set_at DESC LIMIT 1) p ON true
 WHERE le.kind IN ('settle', 'expire')
   AND NOT EXISTS (SELECT FROM account c WHERE c.funding = le.reservation_id);
GRANT SELECT ON money_line TO fanout_app, fanout_auditor;
