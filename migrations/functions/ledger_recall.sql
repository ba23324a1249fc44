-- ledger_recall takes back, into run account p_run's pool, what the slices
-- of its other tasks (not p_except) have left and posts what they spent
-- (ledger_uncarve): the parent's recall of docs/ledger.md#budget-slices.
-- The slices' rows are locked in account order after the run's (root
-- first): a call under way on one (its holder's reserve or settle, which
-- holds that row alone) commits first, and the recall takes what it left.
-- It returns what came back. Callers hold the locks of the run's chain,
-- root first.
CREATE OR REPLACE FUNCTION ledger_recall(p_run bigint, p_except bigint) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    s   account;
    got bigint := 0;
BEGIN
    FOR s IN SELECT * FROM account
              WHERE parent_id = p_run AND kind = 'task' AND cap_tokens IS NOT NULL
                AND account_id IS DISTINCT FROM p_except AND limit_tokens - reserved - spent > 0
              ORDER BY account_id FOR UPDATE LOOP
        got := got + ledger_uncarve(s.account_id, true);
    END LOOP;
    RETURN got;
END $$;
REVOKE ALL ON FUNCTION ledger_recall(bigint, bigint) FROM PUBLIC;
