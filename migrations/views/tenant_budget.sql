-- tenant_budget: each tenant account's budget as of now, as if the period
-- had rolled over when its end has passed (the roll itself waits for the
-- next statement that locks the account).
CREATE VIEW tenant_budget AS
SELECT a.tenant_id, a.account_id, a.period_kind, a.period_every, a.period_limit, a.min_reservation,
       a.reserved AS reserved_tokens, a.spent AS spent_tokens,
       CASE WHEN due THEN greatest(a.spent + a.period_limit, a.spent + a.reserved + a.held) ELSE a.limit_tokens END AS limit_tokens,
       CASE WHEN due THEN 0 ELSE a.spent - a.period_base END AS period_spent_tokens,
       CASE WHEN due THEN ledger_period_next_end(a.period_kind, a.period_every, a.period_end, now())
            ELSE a.period_end END AS period_end,
       a.state, a.created_at, a.updated_at, a.held AS held_tokens
  FROM account a CROSS JOIN LATERAL (SELECT a.period_end IS NOT NULL AND now() >= a.period_end AS due) d
 WHERE a.kind = 'tenant';
GRANT SELECT ON tenant_budget TO fanout_app, fanout_admin, fanout_auditor;
