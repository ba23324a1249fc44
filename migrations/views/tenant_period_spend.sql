-- tenant_period_spend: what each tenant spent in each of its periods,
-- reported and estimated, from the entries: the settle and expire entries
-- on its chain, and those of its runs' budget slices (chain = [task]),
-- whose spend is posted in the period they were written in
-- (docs/ledger.md#budget-slices).
CREATE VIEW tenant_period_spend AS
SELECT p.tenant_id, p.account_id, p.period_kind, p.period_start, p.period_end,
       coalesce(sum(le.delta_spent), 0) AS spent_tokens,
       coalesce(sum(le.delta_spent) FILTER (WHERE NOT le.estimated), 0) AS reported_tokens,
       coalesce(sum(le.delta_spent) FILTER (WHERE le.estimated), 0) AS estimated_tokens,
       coalesce(sum(le.overrun), 0) AS overrun_tokens,
       count(DISTINCT le.run_id) AS runs
  FROM (SELECT tp.*, lead(tp.first_entry_id) OVER (PARTITION BY tp.account_id ORDER BY tp.first_entry_id) AS next_entry_id
          FROM tenant_period tp) p
  LEFT JOIN ledger_entry le
         ON le.tenant_id = p.tenant_id AND le.kind IN ('settle', 'expire')
        AND (le.chain[1] = p.account_id
             OR le.chain[1] IN (SELECT s.account_id FROM account s JOIN account r ON r.account_id = s.parent_id
                                 WHERE s.cap_tokens IS NOT NULL AND r.parent_id = p.account_id))
        AND le.entry_id >= p.first_entry_id AND (p.next_entry_id IS NULL OR le.entry_id < p.next_entry_id)
 GROUP BY p.tenant_id, p.account_id, p.period_kind, p.period_start, p.period_end, p.first_entry_id;
GRANT SELECT ON tenant_period_spend TO fanout_app, fanout_auditor;
