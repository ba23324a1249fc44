-- ledger_open_run creates a run's account (under p_tenant_account, or the
-- tenant's account when NULL and the tenant has one) and one account per
-- task, or returns the existing ones: the run
-- account first, then its tasks. A tenant account of another tenant is
-- refused (SQLSTATE 22023, "belongs to tenant"); an unknown one is
-- foreign_key_violation. It locks the tenant account and rolls its budget
-- period over when it has ended. The run holds p_held tokens back for its
-- synthesis (account.held, migration 0026): at most p_limit - p_min, and
-- under a tenant budget at most what the tenant has available, which holds
-- the same amount (the run account returned says what was held). A task
-- given a slice size in p_task_slices (> 0; 0 or none: not sliced) holds a
-- slice of the run's budget (docs/ledger.md#budget-slices): its
-- limit_tokens starts at 0 and its cap is its limit in p_task_limits; its
-- first slice is carved when its first attempt begins. A child run
-- (p_parent_task and p_funding, given only by ledger_open_child_run) is
-- the root of its own chain, under no tenant account, and holds nothing
-- for a synthesis (docs/ledger.md#child-runs).
DROP FUNCTION IF EXISTS ledger_open_run(text,text,bigint,bigint,bigint,text[],bigint[]);
DROP FUNCTION IF EXISTS ledger_open_run(text,text,bigint,bigint,bigint,text[],bigint[],bigint); -- gained the slices (0030)
DROP FUNCTION IF EXISTS ledger_open_run(text,text,bigint,bigint,bigint,text[],bigint[],bigint,bigint[]); -- gained child runs (0041)
CREATE OR REPLACE FUNCTION ledger_open_run(p_run text, p_tenant text, p_tenant_account bigint, p_limit bigint,
                                p_min bigint, p_task_ids text[], p_task_limits bigint[],
                                p_held bigint DEFAULT 0, p_task_slices bigint[] DEFAULT NULL,
                                p_parent_task bigint DEFAULT NULL, p_funding bigint DEFAULT NULL)
RETURNS SETOF account
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    parent_chain bigint[] := '{}';
    parent_tenant text;
    run_acct bigint;
    run_chain bigint[];
    parent account;
    v_held bigint := coalesce(p_held, 0);
BEGIN
    IF p_run IS NULL OR p_run = '' OR p_tenant IS NULL OR p_tenant = '' OR p_limit IS NULL OR p_limit <= 0
       OR p_min IS NULL OR p_min <= 0 OR p_min > p_limit
       OR cardinality(p_task_ids) IS DISTINCT FROM cardinality(p_task_limits)
       OR v_held < 0 OR v_held > p_limit - p_min
       OR (p_parent_task IS NULL) <> (p_funding IS NULL) OR (p_funding IS NOT NULL AND v_held <> 0)
       OR (p_task_slices IS NOT NULL AND (cardinality(p_task_slices) IS DISTINCT FROM cardinality(p_task_ids)
                                          OR EXISTS (SELECT FROM unnest(p_task_slices) x WHERE x IS NULL OR x < 0))) THEN
        RAISE EXCEPTION 'ledger_open_run: run %, tenant %, limit %, min %, held % out of range (held at most limit - min)',
            p_run, p_tenant, p_limit, p_min, v_held
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT FROM account WHERE run_id = p_run AND kind = 'run') THEN
        -- A tenant with a budget has every run under it, named or not: a
        -- budget set between the caller's admission and this call counts.
        -- The tenant's row, shared, orders this with a first budget being
        -- set (ledger_set_tenant_budget locks it for update): either that
        -- budget is committed and read here, or it waits for this run and
        -- adopts it.
        -- A child run's opener took the tenant's row before its funding's
        -- accounts (ledger_open_child_run).
        IF p_funding IS NULL THEN
            INSERT INTO tenant (tenant_id) VALUES (p_tenant) ON CONFLICT DO NOTHING;
            PERFORM FROM tenant WHERE tenant_id = p_tenant FOR SHARE;
        END IF;
        IF p_tenant_account IS NULL AND p_funding IS NULL THEN
            SELECT account_id INTO p_tenant_account FROM account WHERE tenant_id = p_tenant AND kind = 'tenant';
        END IF;
        IF p_tenant_account IS NOT NULL THEN
            SELECT * INTO parent FROM account WHERE account_id = p_tenant_account AND kind = 'tenant' FOR UPDATE;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'tenant account % not found', p_tenant_account USING ERRCODE = 'foreign_key_violation';
            END IF;
            parent_chain := parent.chain;
            parent_tenant := parent.tenant_id;
            IF parent_tenant <> p_tenant THEN
                RAISE EXCEPTION 'tenant account % belongs to tenant %, not %', p_tenant_account, parent_tenant, p_tenant
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            IF parent.period_end IS NOT NULL AND now() >= parent.period_end THEN
                parent := ledger_roll_period(parent);
            END IF;
            -- The tenant holds what its run holds: no more than it has.
            v_held := least(v_held, greatest(ledger_available(parent), 0));
        END IF;
        INSERT INTO account (tenant_id, parent_id, chain, kind, run_id, limit_tokens, min_reservation, held,
                             parent_task, parent_task_kind, funding)
        VALUES (p_tenant, p_tenant_account, '{}', 'run', p_run, p_limit, p_min, v_held,
                p_parent_task, CASE WHEN p_parent_task IS NOT NULL THEN 'task' END, p_funding)
        RETURNING account_id INTO run_acct;
        run_chain := parent_chain || run_acct;
        UPDATE account SET chain = run_chain WHERE account_id = run_acct;
        -- A task with a slice size is sliced: its limit is what is carved
        -- for it (nothing yet), its cap the limit asked for.
        INSERT INTO account (tenant_id, parent_id, chain, kind, run_id, task_id, limit_tokens, cap_tokens, slice_size)
        SELECT p_tenant, run_acct, '{}', 'task', p_run, t.task_id,
               CASE WHEN t.slice > 0 THEN 0 ELSE t.limit_tokens END,
               CASE WHEN t.slice > 0 THEN t.limit_tokens END,
               CASE WHEN t.slice > 0 THEN least(t.slice, t.limit_tokens) END
          FROM unnest(p_task_ids, p_task_limits, coalesce(p_task_slices, array_fill(0::bigint, ARRAY[coalesce(cardinality(p_task_ids), 0)])))
               AS t(task_id, limit_tokens, slice);
        UPDATE account SET chain = run_chain || account_id WHERE run_id = p_run AND kind = 'task';
        INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, kind, delta_limit)
        SELECT tenant_id, run_id, task_id, account_id, ARRAY[account_id], 'open', limit_tokens
          FROM account WHERE run_id = p_run ORDER BY account_id;
        IF v_held > 0 THEN
            UPDATE account SET held = held + v_held, updated_at = now()
             WHERE account_id = ANY (parent_chain);
            INSERT INTO ledger_entry (tenant_id, run_id, account_id, chain, kind, delta_held, note)
            VALUES (p_tenant, p_run, run_acct, run_chain, 'hold', v_held, 'held back for the run''s synthesis');
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM account WHERE run_id = p_run ORDER BY (kind = 'task'), account_id;
END $$;
REVOKE ALL ON FUNCTION ledger_open_run(text,text,bigint,bigint,bigint,text[],bigint[],bigint,bigint[],bigint,bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_open_run(text,text,bigint,bigint,bigint,text[],bigint[],bigint,bigint[],bigint,bigint) TO fanout_app;
