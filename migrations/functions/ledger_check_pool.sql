-- ledger_check_pool is the exhaustion check after a slice of task account
-- p_task was topped up (a reserve, or a settle's overrun): when its run's
-- pool is left below its min_reservation, the other slices' unused tokens
-- are recalled first (ledger_recall), and only a pool that, with what the
-- caller's own slice has left, is still below it marks the run exhausted
-- (ledger_check_exhausted); a tenant left below its own
-- minimum, after a recall of its other runs' unused slices, exhausts its
-- runs (docs/ledger.md#budget-slices). Callers hold the locks of the
-- task's chain, root first.
CREATE OR REPLACE FUNCTION ledger_check_pool(p_task bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    t account;
    a account;
BEGIN
    SELECT * INTO t FROM account WHERE account_id = p_task;
    FOR a IN SELECT * FROM account WHERE account_id = ANY (t.chain[1:cardinality(t.chain) - 1]) ORDER BY chain LOOP
        IF a.kind = 'tenant' AND a.state = 'open' AND ledger_below_minimum(a, 0) THEN
            PERFORM ledger_recall(t.chain[cardinality(t.chain) - 1], p_task, true);
            SELECT * INTO a FROM account WHERE account_id = a.account_id;
            IF ledger_below_minimum(a, 0) THEN
                PERFORM ledger_exhaust_tenant(a);
            END IF;
        ELSIF a.kind = 'run' AND a.state = 'open' AND ledger_below_minimum(a, 0) THEN
            PERFORM ledger_recall(a.account_id, p_task);
            -- The caller's own slice counts too: its unused tokens pay its
            -- next calls, and its refusal exhausts the run when they do not.
            SELECT * INTO a FROM account WHERE account_id = a.account_id;
            SELECT * INTO t FROM account WHERE account_id = p_task;
            IF ledger_available(a) + greatest(ledger_available(t), 0) < a.min_reservation THEN
                PERFORM ledger_check_exhausted(t.chain);
            END IF;
        END IF;
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION ledger_check_pool(bigint) FROM PUBLIC;
