-- ledger_uncarve_many is ledger_uncarve for each sliced task account of
-- p_tasks (all of one run), set-based: one UPDATE of the tasks, one of the
-- accounts above, one INSERT of the entries, whatever the number of tasks
-- (a batch of task ends, a run's close, a recall). It returns what went
-- back in all. Callers hold the locks of the run's chain, then the tasks',
-- root first.
CREATE OR REPLACE FUNCTION ledger_uncarve_many(p_tasks bigint[], p_return boolean) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    above bigint[];
    back  bigint;
    moved bigint;
    posts bigint;
BEGIN
    SELECT r.chain INTO above FROM account r
     WHERE r.account_id = (SELECT t.parent_id FROM account t WHERE t.account_id = ANY (p_tasks) AND t.kind = 'task' LIMIT 1);
    IF above IS NULL THEN
        RETURN 0;
    END IF;
    WITH s AS (
        SELECT t.account_id, t.tenant_id, t.run_id, t.task_id,
               CASE WHEN p_return THEN greatest(ledger_available(t), 0) ELSE 0 END AS free, t.spent - t.posted AS x
          FROM account t
         WHERE t.account_id = ANY (p_tasks) AND t.cap_tokens IS NOT NULL AND t.parent_id = above[cardinality(above)]),
    u AS (
        UPDATE account t SET limit_tokens = t.limit_tokens - s.free, posted = t.spent, updated_at = now()
          FROM s WHERE t.account_id = s.account_id AND (s.free > 0 OR s.x > 0)
        RETURNING s.account_id, s.tenant_id, s.run_id, s.task_id, s.free, s.x),
    e AS (
        INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, kind, delta_limit, delta_reserved, delta_spent, note)
        SELECT u.tenant_id, u.run_id, u.task_id, u.account_id, CASE WHEN k.up THEN above ELSE ARRAY[u.account_id] END,
               'return', CASE WHEN k.up THEN 0 ELSE -u.free END, CASE WHEN k.up THEN -u.free - u.x ELSE 0 END,
               CASE WHEN k.up THEN u.x ELSE 0 END,
               CASE WHEN k.up THEN format('task account %s: %s tokens of its slice back, %s spent posted', u.account_id, u.free, u.x)
                    ELSE '' END
          FROM u CROSS JOIN (VALUES (true), (false)) AS k(up)
         WHERE k.up OR u.free > 0
         ORDER BY u.account_id, NOT k.up)
    SELECT coalesce(sum(u.free), 0), coalesce(sum(u.free + u.x), 0), coalesce(sum(u.x), 0) INTO back, moved, posts FROM u;
    IF moved > 0 THEN
        UPDATE account SET reserved = reserved - moved, spent = spent + posts, updated_at = now()
         WHERE account_id = ANY (above);
    END IF;
    IF back > 0 THEN
        PERFORM ledger_give_back(above);
    END IF;
    RETURN back;
END $$;
REVOKE ALL ON FUNCTION ledger_uncarve_many(bigint[], boolean) FROM PUBLIC;
