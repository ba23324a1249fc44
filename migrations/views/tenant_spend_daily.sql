-- tenant_spend_daily: what each tenant spent per UTC day, as its account
-- counts it: a child run's spend once, through the funding its parent task
-- settles (or the sweeper expires) when the child ends, not its own entries
-- too (docs/ledger.md#child-runs).
CREATE VIEW tenant_spend_daily AS
SELECT tenant_id, (created_at AT TIME ZONE 'UTC')::date AS day,
       sum(delta_spent) AS spent_tokens,
       sum(delta_spent) FILTER (WHERE NOT estimated) AS reported_tokens,
       coalesce(sum(delta_spent) FILTER (WHERE estimated), 0) AS estimated_tokens,
       sum(overrun) AS overrun_tokens,
       count(DISTINCT run_id) AS runs
  FROM ledger_entry
 WHERE kind IN ('settle', 'expire')
   AND NOT EXISTS (SELECT FROM account c WHERE c.account_id = ledger_entry.chain[1] AND c.funding IS NOT NULL)
 GROUP BY tenant_id, (created_at AT TIME ZONE 'UTC')::date;
GRANT SELECT ON tenant_spend_daily TO fanout_app, fanout_auditor;
