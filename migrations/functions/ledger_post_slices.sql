-- ledger_post_slices posts to tenant account t what the slices of its runs'
-- tasks spent and did not post yet (ledger_uncarve without a return), and
-- has them end with the period that starts now, at p_until: a slice never
-- outlives the period it is counted in (docs/ledger.md#budget-slices).
-- ledger_roll_period calls it before a period rolls over, so what the
-- slices spent before the end counts in the period that ends. It locks the
-- tenant's open runs and their sliced tasks, root first, and returns t as
-- it is then. Callers hold t's lock.
CREATE OR REPLACE FUNCTION ledger_post_slices(t account, p_until timestamptz) RETURNS account
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    s account;
BEGIN
    IF NOT EXISTS (SELECT FROM account WHERE chain[1] = t.account_id AND kind = 'task' AND cap_tokens IS NOT NULL
                                        AND state <> 'closed') THEN
        RETURN t;
    END IF;
    PERFORM FROM account
      WHERE chain[1] = t.account_id AND state <> 'closed' AND (kind = 'run' OR (kind = 'task' AND cap_tokens IS NOT NULL))
      ORDER BY chain FOR UPDATE;
    FOR s IN SELECT * FROM account
              WHERE chain[1] = t.account_id AND kind = 'task' AND cap_tokens IS NOT NULL AND state <> 'closed'
              ORDER BY chain LOOP
        PERFORM ledger_uncarve(s.account_id, false);
    END LOOP;
    UPDATE account SET slice_until = p_until
     WHERE chain[1] = t.account_id AND kind = 'task' AND cap_tokens IS NOT NULL AND state <> 'closed';
    SELECT * INTO t FROM account WHERE account_id = t.account_id;
    RETURN t;
END $$;
REVOKE ALL ON FUNCTION ledger_post_slices(account, timestamptz) FROM PUBLIC;
