CREATE VIEW run_spend AS
SELECT a.tenant_id, a.run_id, a.limit_tokens,
       -- What its tasks' slices spent counts as spent here before it is
       -- posted to the run's account (docs/ledger.md#budget-slices).
       (a.reserved - coalesce(u.unposted, 0))::bigint AS reserved_tokens, (a.spent + coalesce(u.unposted, 0))::bigint AS spent_tokens,
       a.limit_tokens - a.reserved - a.spent - a.held AS available_tokens, a.state, a.cause,
       coalesce(r.reported, 0) AS reported_tokens, coalesce(r.estimated, 0) AS estimated_tokens,
       coalesce(r.overrun, 0) AS overrun_tokens, coalesce(r.reservations, 0) AS reservations,
       a.created_at, a.updated_at,
       a.held AS held_tokens, coalesce(r.synthesis, 0) AS synthesis_tokens
  FROM account a
  LEFT JOIN (SELECT run_id,
                    sum(spent) FILTER (WHERE NOT estimated) AS reported,
                    sum(spent) FILTER (WHERE estimated) AS estimated,
                    sum(overrun) AS overrun, count(*) AS reservations,
                    sum(spent) FILTER (WHERE from_held) AS synthesis
               FROM reservation GROUP BY run_id) r USING (run_id)
  LEFT JOIN (SELECT parent_id AS account_id, sum(spent - posted) AS unposted
               FROM account WHERE kind = 'task' AND cap_tokens IS NOT NULL
              GROUP BY parent_id) u USING (account_id)
 WHERE a.kind = 'run';
GRANT SELECT ON run_spend TO fanout_app, fanout_auditor;
