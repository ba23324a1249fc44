-- ledger_open_tenant creates (or returns) a tenant's account: period none,
-- p_limit in all. Not logged: it is the node's call; budgets set by an
-- operator go through ledger_set_tenant_budget.
CREATE OR REPLACE FUNCTION ledger_open_tenant(p_tenant text, p_limit bigint) RETURNS SETOF account
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    id bigint;
    e  bigint;
BEGIN
    IF p_tenant IS NULL OR p_tenant = '' OR p_limit IS NULL OR p_limit <= 0 THEN
        RAISE EXCEPTION 'ledger_open_tenant: tenant % limit % out of range', p_tenant, p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO tenant (tenant_id) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    INSERT INTO account (tenant_id, chain, kind, limit_tokens, period_limit)
    VALUES (p_tenant, '{}', 'tenant', p_limit, p_limit)
    ON CONFLICT (tenant_id) WHERE kind = 'tenant' DO NOTHING
    RETURNING account_id INTO id;
    IF id IS NOT NULL THEN
        UPDATE account SET chain = ARRAY[account_id] WHERE account_id = id;
        INSERT INTO ledger_entry (tenant_id, account_id, chain, kind, delta_limit, note)
        VALUES (p_tenant, id, ARRAY[id], 'open', p_limit, 'tenant account')
        RETURNING entry_id INTO e;
        INSERT INTO tenant_period (account_id, tenant_id, period_kind, period_start, period_end, first_entry_id)
        VALUES (id, p_tenant, 'none', now(), NULL, e);
    END IF;
    RETURN QUERY SELECT * FROM account WHERE tenant_id = p_tenant AND kind = 'tenant';
END $$;
REVOKE ALL ON FUNCTION ledger_open_tenant(text,bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_open_tenant(text,bigint) TO fanout_admin;
