CREATE VIEW tenant_spend_money_daily AS
SELECT tenant_id, (created_at AT TIME ZONE 'UTC')::date AS day, currency,
       coalesce(sum(cost), 0) AS cost,
       coalesce(sum(cost) FILTER (WHERE NOT worst_case), 0) AS reported_cost,
       coalesce(sum(cost) FILTER (WHERE worst_case), 0) AS worst_case_cost,
       coalesce(sum(tokens) FILTER (WHERE cost IS NOT NULL), 0) AS priced_tokens,
       coalesce(sum(tokens) FILTER (WHERE cost IS NOT NULL AND worst_case), 0) AS worst_case_tokens,
       coalesce(sum(tokens) FILTER (WHERE cost IS NULL), 0) AS unpriced_tokens,
       count(DISTINCT run_id) AS runs
  FROM money_line
 GROUP BY tenant_id, (created_at AT TIME ZONE 'UTC')::date, currency;
GRANT SELECT ON tenant_spend_money_daily TO fanout_app, fanout_auditor;
