-- ledger_mark_tasks gives the sliced task accounts of the runs p_runs that
-- are still open the state p_state their run just took (exhausted or
-- cancelled): a call on a slice locks only the task's row, so the row
-- itself must say that nothing more is granted (docs/ledger.md#budget-slices).
-- The rows are locked in chain order after their runs' (root first);
-- a call under way on one of them finishes first, and every call after
-- this commit sees the state. Callers hold the runs' locks.
--
-- The state goes down the tree in the same transaction: every child run
-- carved from a task of p_runs (docs/ledger.md#child-runs) that is open
-- (or exhausted, when p_state is cancelled) takes it too, with an entry
-- and a notice of its own, and so do its slices and its children, to every
-- depth. A child's chain starts at itself, so its own row is what refuses
-- its calls: no grant at any level after the commit that ended an
-- ancestor. Children are locked after their parents (tree order, as every
-- child's own transaction takes its rows).
CREATE OR REPLACE FUNCTION ledger_mark_tasks(p_runs bigint[], p_state text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    c    account;
    kids bigint[];
BEGIN
    PERFORM FROM account
      WHERE parent_id = ANY (p_runs) AND kind = 'task' AND cap_tokens IS NOT NULL AND state = 'open'
      ORDER BY chain FOR UPDATE;
    UPDATE account SET state = p_state, updated_at = now()
     WHERE parent_id = ANY (p_runs) AND kind = 'task' AND cap_tokens IS NOT NULL AND state = 'open';
    SELECT array_agg(account_id ORDER BY account_id) INTO kids
      FROM (SELECT k.account_id FROM account k
             WHERE k.kind = 'run'
               AND k.parent_task IN (SELECT account_id FROM account WHERE parent_id = ANY (p_runs) AND kind = 'task')
               AND (k.state = 'open' OR (k.state = 'exhausted' AND p_state = 'cancelled'))
             ORDER BY k.account_id FOR UPDATE) AS l;
    IF kids IS NULL THEN
        RETURN;
    END IF;
    FOR c IN UPDATE account k SET state = p_state, updated_at = now(),
                                  cause = format('run %s above it is %s', p.run_id, p_state)
               FROM account t, account p
              WHERE k.account_id = ANY (kids) AND t.account_id = k.parent_task AND p.account_id = t.parent_id
                AND (k.state = 'open' OR (k.state = 'exhausted' AND p_state = 'cancelled'))
             RETURNING k.* LOOP
        INSERT INTO ledger_entry (tenant_id, run_id, account_id, chain, kind, note)
        VALUES (c.tenant_id, c.run_id, c.account_id, ARRAY[c.account_id],
                CASE p_state WHEN 'exhausted' THEN 'exhaust' ELSE 'cancel' END, c.cause);
        PERFORM pg_notify('fanout_run_state', p_state || ' ' || c.run_id);
    END LOOP;
    PERFORM ledger_mark_tasks(kids, p_state);
END $$;
REVOKE ALL ON FUNCTION ledger_mark_tasks(bigint[], text) FROM PUBLIC;
