-- ledger_recall takes back, into run account p_run's pool, what the slices
-- of its other tasks (not p_except) have left and posts what they spent
-- (ledger_uncarve): the parent's recall of docs/ledger.md#budget-slices.
-- The slices' rows are locked in account order after the run's (root
-- first): a call under way on one (its holder's reserve or settle, which
-- holds that row alone) commits first, and the recall takes what it left.
-- With p_tenant_wide, the slices of every run of the run's tenant are
-- recalled: a tenant budget too small for a slice of one run takes back
-- what the others' slices do not use. It returns what came back. Callers
-- hold the locks of the run's chain, root first.
CREATE OR REPLACE FUNCTION ledger_recall(p_run bigint, p_except bigint, p_tenant_wide boolean DEFAULT false) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    s   account;
    got bigint := 0;
BEGIN
    FOR s IN SELECT * FROM account
              WHERE kind = 'task' AND cap_tokens IS NOT NULL
                AND (parent_id = p_run
                     OR p_tenant_wide AND parent_id IN (SELECT r.account_id FROM account r, account me
                                                         WHERE me.account_id = p_run AND r.parent_id = me.parent_id
                                                           AND r.kind = 'run' AND me.parent_id IS NOT NULL))
                AND account_id IS DISTINCT FROM p_except AND limit_tokens - reserved - spent > 0
              ORDER BY chain FOR UPDATE LOOP
        got := got + ledger_uncarve(s.account_id, true);
    END LOOP;
    RETURN got;
END $$;
DROP FUNCTION IF EXISTS ledger_recall(bigint, bigint);
REVOKE ALL ON FUNCTION ledger_recall(bigint, bigint, boolean) FROM PUBLIC;
