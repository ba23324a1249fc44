-- ledger_wind_down marks the tasks p_tasks of run p_run as winding down
-- (account.wind_down on their task accounts): what the run has left pays
-- only for their final answers (docs/budget.md#wind-down-instead-of-cut-off). Every grant on a marked
-- account carries the mark (ledger_result.wind_down), and the subagent
-- that asked makes that iteration its last, without tools; a task started
-- later is not marked. A hedged task's second attempt (its account's task
-- id is '_hedge:' || the task's, ledger_open_hedge) is marked with it:
-- both attempts are the task (docs/budget.md#hedged-tasks). Only the run's current owner marks (p_epoch,
-- ledger_check_owner); marking a marked or ended task changes nothing.
-- Returns how many accounts it marked.
DROP FUNCTION IF EXISTS ledger_wind_down(text,bigint);
CREATE OR REPLACE FUNCTION ledger_wind_down(p_run text, p_epoch bigint, p_tasks text[])
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    marked bigint;
BEGIN
    PERFORM ledger_check_owner(p_run, p_epoch, 'ledger_wind_down');
    UPDATE account a SET wind_down = true, updated_at = now()
     WHERE a.kind = 'task' AND a.run_id = p_run
       AND (a.task_id = ANY (p_tasks)
            OR a.task_id LIKE '\_hedge:%' AND substr(a.task_id, length('_hedge:') + 1) = ANY (p_tasks))
       AND a.state IN ('open', 'exhausted') AND NOT a.wind_down;
    GET DIAGNOSTICS marked = ROW_COUNT;
    RETURN marked;
END $$;
REVOKE ALL ON FUNCTION ledger_wind_down(text,bigint,text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_wind_down(text,bigint,text[]) TO fanout_app;
