-- ledger_uncarve settles sliced task account p_task with the accounts
-- above it (docs/ledger.md#budget-slices): what it spent and did not post
-- yet is posted there (moved from reserved to spent), and, with p_return,
-- what its slice has left (available) goes back to them, lowering its
-- limit_tokens. What its held reservations hold stays carved. One return
-- entry on the accounts above, one on the task when tokens went back.
-- It returns what went back. Callers hold the locks of the task's chain,
-- root first.
CREATE OR REPLACE FUNCTION ledger_uncarve(p_task bigint, p_return boolean) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    t     account;
    free  bigint := 0;
    x     bigint;
    above bigint[];
BEGIN
    SELECT * INTO t FROM account WHERE account_id = p_task;
    IF NOT FOUND OR t.cap_tokens IS NULL THEN
        RETURN 0;
    END IF;
    IF p_return THEN
        free := greatest(ledger_available(t), 0);
    END IF;
    x := t.spent - t.posted;
    IF free = 0 AND x = 0 THEN
        RETURN 0;
    END IF;
    above := t.chain[1:cardinality(t.chain) - 1];
    UPDATE account SET reserved = reserved - free - x, spent = spent + x, updated_at = now()
     WHERE account_id = ANY (above);
    UPDATE account SET limit_tokens = limit_tokens - free, posted = spent, updated_at = now()
     WHERE account_id = p_task;
    INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, kind, delta_reserved, delta_spent, note)
    VALUES (t.tenant_id, t.run_id, t.task_id, t.account_id, above, 'return', -free - x, x,
            format('task account %s: %s tokens of its slice back, %s spent posted', t.account_id, free, x));
    IF free > 0 THEN
        INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, kind, delta_limit)
        VALUES (t.tenant_id, t.run_id, t.task_id, t.account_id, ARRAY[t.account_id], 'return', -free);
        PERFORM ledger_give_back(above);
    END IF;
    RETURN free;
END $$;
REVOKE ALL ON FUNCTION ledger_uncarve(bigint, boolean) FROM PUBLIC;
