-- ledger_return_slices gives back to run p_run what
-- the slices of its tasks p_task_ids have left, and posts what they spent
-- (ledger_uncarve): the orchestrator calls it in the transaction that
-- records those tasks' ends, so that what a task did not use is the run's
-- again, and its tenant's, from that commit (docs/ledger.md#budget-slices).
-- What their held reservations hold stays carved until they resolve.
-- Unknown tasks and tasks that are not sliced are skipped. It locks the
-- run's chain, then the tasks in account order (root first).
CREATE OR REPLACE FUNCTION ledger_return_slices(p_run text, p_task_ids text[]) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    run account;
    ids bigint[];
BEGIN
    SELECT * INTO run FROM account WHERE run_id = p_run AND kind = 'run';
    IF NOT FOUND OR NOT EXISTS (SELECT FROM account WHERE run_id = p_run AND kind = 'task' AND task_id = ANY (p_task_ids)
                                                   AND cap_tokens IS NOT NULL) THEN
        RETURN 0;
    END IF;
    PERFORM FROM ledger_lock_chain(run.chain);
    SELECT array_agg(account_id ORDER BY account_id) INTO ids
      FROM (SELECT account_id FROM account
             WHERE run_id = p_run AND kind = 'task' AND task_id = ANY (p_task_ids) AND cap_tokens IS NOT NULL
             ORDER BY account_id FOR UPDATE) AS l;
    RETURN ledger_uncarve_many(ids, true);
END $$;
REVOKE ALL ON FUNCTION ledger_return_slices(text,text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_return_slices(text,text[]) TO fanout_app;
