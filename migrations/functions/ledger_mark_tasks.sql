-- ledger_mark_tasks gives the sliced task accounts of the runs p_runs that
-- are still open the state p_state their run just took (exhausted or
-- cancelled): a call on a slice locks only the task's row, so the row
-- itself must say that nothing more is granted (docs/ledger.md#budget-slices).
-- The rows are locked in chain order after their runs' (root first);
-- a call under way on one of them finishes first, and every call after
-- this commit sees the state. Callers hold the runs' locks.
CREATE OR REPLACE FUNCTION ledger_mark_tasks(p_runs bigint[], p_state text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    PERFORM FROM account
      WHERE parent_id = ANY (p_runs) AND kind = 'task' AND cap_tokens IS NOT NULL AND state = 'open'
      ORDER BY chain FOR UPDATE;
    UPDATE account SET state = p_state, updated_at = now()
     WHERE parent_id = ANY (p_runs) AND kind = 'task' AND cap_tokens IS NOT NULL AND state = 'open';
END $$;
REVOKE ALL ON FUNCTION ledger_mark_tasks(bigint[], text) FROM PUBLIC;
