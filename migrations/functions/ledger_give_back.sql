-- ledger_give_back lowers the limit of the tenant account at the root of
-- p_chain back toward its budget (period_base + period_limit) once the
-- reservations it was raised to cover are resolved. A limit is raised
-- above the budget only to cover what was held when a period or a budget
-- began (ledger_roll_period, ledger_set_tenant_budget, ledger_adopt_runs):
-- it may never be spent on new grants, so as what it covered is settled,
-- voided or expired the limit follows spent + reserved down, never below
-- the budget. Callers hold the chain's locks, after their own update.
CREATE OR REPLACE FUNCTION ledger_give_back(p_chain bigint[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    t         account;
    new_limit bigint;
BEGIN
    SELECT * INTO t FROM account WHERE account_id = p_chain[1] AND kind = 'tenant';
    IF NOT FOUND OR t.period_limit IS NULL THEN
        RETURN;
    END IF;
    new_limit := greatest(t.period_base + t.period_limit, t.spent + t.reserved + t.held);
    IF new_limit >= t.limit_tokens THEN
        RETURN;
    END IF;
    INSERT INTO ledger_entry (tenant_id, account_id, chain, kind, delta_limit, note)
    VALUES (t.tenant_id, t.account_id, ARRAY[t.account_id], 'adjust', new_limit - t.limit_tokens,
            format('limit %s raised above the budget %s to cover what was held; given back as it resolved',
                   t.limit_tokens, t.period_base + t.period_limit));
    UPDATE account SET limit_tokens = new_limit, updated_at = now()
     WHERE account_id = t.account_id
    RETURNING * INTO t;
    IF ledger_below_minimum(t, 0) THEN
        PERFORM ledger_exhaust_tenant(t);
    END IF;
END $$;
REVOKE ALL ON FUNCTION ledger_give_back(bigint[]) FROM PUBLIC;
