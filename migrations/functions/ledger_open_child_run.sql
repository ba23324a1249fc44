-- ledger_open_child_run opens run p_run as a child of the task account
-- p_parent_task (docs/ledger.md#child-runs): one reservation on the task,
-- granted as any call of the task's current attempt p_attempt is
-- (ledger_reserve: every account of the task's chain open, at most what
-- each has available, at least p_min, else nothing), funds it, and the
-- child's account is opened with exactly that grant as its limit: a child
-- is never carved past what its parent task has left. The reservation is
-- the orchestrator's alone (no attempt secret opens it: a worker's login
-- can neither settle nor void it) and is renewed while the child runs;
-- ledger_settle_funding posts what the child spent when it closes. The
-- child's tasks are opened as ledger_open_run opens a run's. Returns the
-- funding reservation's result: ok (opened now), replay (p_run was opened
-- so before), exhausted or denied as a reserve answers (nothing written),
-- conflict when p_run is a run that is not this task's child.
CREATE OR REPLACE FUNCTION ledger_open_child_run(p_run text, p_tenant text, p_parent_task bigint, p_attempt bigint,
                                      p_want bigint, p_min bigint, p_ttl interval,
                                      p_task_ids text[], p_task_limits bigint[], p_task_slices bigint[] DEFAULT NULL)
RETURNS ledger_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    t     account;
    c     account;
    r     reservation;
    res   ledger_result;
    above text;
BEGIN
    IF p_run IS NULL OR p_run = '' OR p_parent_task IS NULL THEN
        RAISE EXCEPTION 'ledger_open_child_run: run % under task account % out of range', p_run, p_parent_task
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO c FROM account WHERE run_id = p_run AND kind = 'run';
    IF FOUND THEN
        SELECT * INTO r FROM reservation WHERE reservation_id = c.funding;
        IF c.parent_task IS DISTINCT FROM p_parent_task THEN
            RETURN ledger_refusal('conflict', c.account_id,
                format('run %s exists and is not a child of task account %s', p_run, p_parent_task));
        END IF;
        RETURN ledger_result_of('replay', r);
    END IF;
    SELECT * INTO t FROM account WHERE account_id = p_parent_task;
    IF NOT FOUND OR t.kind <> 'task' OR t.tenant_id <> p_tenant THEN
        RETURN ledger_refusal('denied', p_parent_task, format('not a task account of tenant %s', p_tenant));
    END IF;
    -- The tenant's row before any account, the order a budget change
    -- takes them in (docs/ledger.md#chain-and-lock-order): the child's
    -- account row refers to it.
    PERFORM FROM tenant WHERE tenant_id = p_tenant FOR SHARE;
    -- No key: a worker holding the task's secret could reserve under any
    -- key first. The child's account, unique by run, is what makes this
    -- idempotent (checked again below, once the grant holds the task).
    res := ledger_reserve(p_parent_task, t.run_id, p_tenant, p_attempt, p_want, p_min,
                          'child:' || p_run, p_ttl, NULL, NULL, NULL);
    IF res.outcome <> 'ok' THEN
        RETURN res;
    END IF;
    -- Two opens of one child serialize on the parent task's row, which the
    -- grant locked: a child opened by the other meanwhile is visible now.
    -- This grant must not stand beside its funding: rolled back, and the
    -- caller's retry answers with that child's (replay).
    IF EXISTS (SELECT FROM account WHERE run_id = p_run AND kind = 'run') THEN
        RAISE EXCEPTION 'ledger_open_child_run: run % was opened meanwhile; try again', p_run
            USING ERRCODE = 'serialization_failure';
    END IF;
    -- No attempt's secret resolves it: only an orchestrator's login does.
    UPDATE reservation SET secret_hash = NULL WHERE reservation_id = res.reservation_id;
    PERFORM ledger_open_run(p_run, p_tenant, NULL, res.amount, p_min, p_task_ids, p_task_limits, 0, p_task_slices,
                            p_parent_task, res.reservation_id);
    -- The grant may have ended the run above (its minimum, or its
    -- tenant's), marking its children before this one existed: it takes
    -- that state now, in the same commit. The run's row was locked by the
    -- grant whenever the grant could end it.
    SELECT state INTO above FROM account WHERE account_id = t.parent_id;
    IF above IN ('exhausted', 'cancelled') THEN
        PERFORM ledger_mark_tasks(ARRAY[t.parent_id], above);
    END IF;
    RETURN res;
END $$;
REVOKE ALL ON FUNCTION ledger_open_child_run(text,text,bigint,bigint,bigint,bigint,interval,text[],bigint[],bigint[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_open_child_run(text,text,bigint,bigint,bigint,bigint,interval,text[],bigint[],bigint[]) TO fanout_app;
