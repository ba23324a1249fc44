-- ledger_carve_many carves, for each sliced task account of p_tasks (all
-- of one run) whose slice has less than its slice_size, what it lacks, as
-- ledger_carve does for one, in account order until the run's pool (and
-- its tenant's) runs out: one UPDATE of the tasks, one of the accounts
-- above, one INSERT of the entries, whatever the number of tasks (the
-- first wave of a run of thousands of tasks is carved in the transaction
-- that opens it). It returns what it carved in all. Callers hold the locks
-- of the run's chain, then the tasks', root first.
CREATE OR REPLACE FUNCTION ledger_carve_many(p_tasks bigint[]) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    a     account;
    above bigint[];
    pool  bigint;
    until timestamptz;
    total bigint;
BEGIN
    SELECT r.* INTO a FROM account r
     WHERE r.account_id = (SELECT t.parent_id FROM account t WHERE t.account_id = ANY (p_tasks) AND t.kind = 'task' LIMIT 1);
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    above := a.chain;
    FOR a IN SELECT * FROM account WHERE account_id = ANY (above) ORDER BY chain LOOP
        IF a.state <> 'open' OR (a.kind = 'tenant' AND ledger_below_minimum(a, 0)) THEN
            RETURN 0;
        END IF;
        pool := least(coalesce(pool, ledger_available(a)), ledger_available(a));
        IF a.kind = 'tenant' THEN
            until := a.period_end;
        END IF;
    END LOOP;
    IF coalesce(pool, 0) <= 0 THEN
        RETURN 0;
    END IF;
    WITH w AS (
        SELECT t.account_id, least(t.slice_size - ledger_available(t), t.cap_tokens - t.limit_tokens) AS w
          FROM account t
         WHERE t.account_id = ANY (p_tasks) AND t.cap_tokens IS NOT NULL AND t.state = 'open' AND t.parent_id = above[cardinality(above)]),
    g AS (
        SELECT w.account_id, greatest(0, least(w.w, pool - (sum(w.w) OVER (ORDER BY w.account_id) - w.w))) AS d
          FROM w WHERE w.w > 0),
    u AS (
        UPDATE account t SET limit_tokens = t.limit_tokens + g.d, slice_until = until, updated_at = now()
          FROM g WHERE t.account_id = g.account_id AND g.d > 0
        RETURNING t.account_id, t.tenant_id, t.run_id, t.task_id, g.d),
    e AS (
        INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, kind, delta_limit, delta_reserved, note)
        SELECT u.tenant_id, u.run_id, u.task_id, u.account_id, CASE WHEN k.up THEN above ELSE ARRAY[u.account_id] END,
               'carve', CASE WHEN k.up THEN 0 ELSE u.d END, CASE WHEN k.up THEN u.d ELSE 0 END,
               CASE WHEN k.up THEN format('a slice of %s tokens for task account %s', u.d, u.account_id) ELSE '' END
          FROM u CROSS JOIN (VALUES (true), (false)) AS k(up)
         ORDER BY u.account_id, NOT k.up)
    SELECT coalesce(sum(u.d), 0) INTO total FROM u;
    IF total > 0 THEN
        UPDATE account SET reserved = reserved + total, updated_at = now() WHERE account_id = ANY (above);
    END IF;
    RETURN total;
END $$;
REVOKE ALL ON FUNCTION ledger_carve_many(bigint[]) FROM PUBLIC;
