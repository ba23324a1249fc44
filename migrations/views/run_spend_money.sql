CREATE VIEW run_spend_money AS
SELECT tenant_id, run_id, currency,
       coalesce(sum(cost), 0) AS cost,
       coalesce(sum(cost) FILTER (WHERE NOT worst_case), 0) AS reported_cost,
       coalesce(sum(cost) FILTER (WHERE worst_case), 0) AS worst_case_cost,
       coalesce(sum(tokens) FILTER (WHERE cost IS NOT NULL), 0) AS priced_tokens,
       coalesce(sum(tokens) FILTER (WHERE cost IS NOT NULL AND worst_case), 0) AS worst_case_tokens,
       coalesce(sum(tokens) FILTER (WHERE cost IS NULL), 0) AS unpriced_tokens
  FROM money_line
 GROUP BY tenant_id, run_id, currency;
GRANT SELECT ON run_spend_money TO fanout_app, fanout_auditor;
