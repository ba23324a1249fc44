CREATE VIEW tenant_spend_daily AS
SELECT tenant_id, (created_at AT TIME ZONE 'UTC')::date AS day,
       sum(delta_spent) AS spent_tokens,
       sum(delta_spent) FILTER (WHERE NOT estimated) AS reported_tokens,
       coalesce(sum(delta_spent) FILTER (WHERE estimated), 0) AS estimated_tokens,
       sum(overrun) AS overrun_tokens,
       count(DISTINCT run_id) AS runs
  FROM ledger_entry
 WHERE kind IN ('settle', 'expire')
 GROUP BY tenant_id, (created_at AT TIME ZONE 'UTC')::date;
GRANT SELECT ON tenant_spend_daily TO fanout_app, fanout_auditor;
