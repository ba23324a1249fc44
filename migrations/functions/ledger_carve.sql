-- ledger_carve carves up to p_amount more tokens for the slice of sliced
-- task account p_task (docs/ledger.md#budget-slices): no more than its
-- cap leaves, and no more than every account above it (its run's, its
-- tenant's) has available, from open accounts only, never from a tenant
-- below its min_reservation. What is carved counts as reserved on every
-- account above and raises the task's limit_tokens; two carve entries say
-- so (one on the accounts above, one on the task). It returns what it
-- carved (0 on an account that is not sliced). A carve never marks a run
-- exhausted: a run is exhausted when a call cannot be paid
-- (ledger_check_pool). Callers hold the locks of the task's chain, root
-- first.
CREATE OR REPLACE FUNCTION ledger_carve(p_task bigint, p_amount bigint) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    t     account;
    a     account;
    d     bigint;
    above bigint[];
    until timestamptz;
BEGIN
    SELECT * INTO t FROM account WHERE account_id = p_task;
    IF NOT FOUND OR t.cap_tokens IS NULL OR t.state <> 'open' THEN
        RETURN 0;
    END IF;
    d := least(p_amount, t.cap_tokens - t.limit_tokens);
    above := t.chain[1:cardinality(t.chain) - 1];
    FOR a IN SELECT * FROM account WHERE account_id = ANY (above) ORDER BY chain LOOP
        IF a.state <> 'open' OR (a.kind = 'tenant' AND ledger_below_minimum(a, 0)) THEN
            RETURN 0;
        END IF;
        d := least(d, ledger_available(a));
        IF a.kind = 'tenant' THEN
            until := a.period_end;
        END IF;
    END LOOP;
    IF d IS NULL OR d <= 0 THEN
        RETURN 0;
    END IF;
    UPDATE account SET reserved = reserved + d, updated_at = now() WHERE account_id = ANY (above);
    UPDATE account SET limit_tokens = limit_tokens + d, slice_until = until, updated_at = now()
     WHERE account_id = p_task;
    INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, kind, delta_reserved, note)
    VALUES (t.tenant_id, t.run_id, t.task_id, t.account_id, above, 'carve', d,
            format('a slice of %s tokens for task account %s', d, t.account_id));
    INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, kind, delta_limit)
    VALUES (t.tenant_id, t.run_id, t.task_id, t.account_id, ARRAY[t.account_id], 'carve', d);
    RETURN d;
END $$;
REVOKE ALL ON FUNCTION ledger_carve(bigint, bigint) FROM PUBLIC;
