-- ledger_continue_run continues run p_run of tenant p_tenant with p_add
-- more tokens (docs/ledger.md#continuations, docs/budget.md#continue), once
-- per idempotency key p_key, on behalf of p_actor (key:ID), and records the
-- continuation (run_continuation) with its entries in this transaction:
--
--   - a run still RUNNING whose account is open (not closing): its limit
--     is raised ('continue'); its owner drives it on with the larger budget
--     (a top-up).
--   - a run that ended BUDGET_EXHAUSTED, whose account is closed: its limit
--     is raised and it reopens ('reopen'): its account and the accounts of
--     the tasks p_tasks (each NOT_STARTED or SKIPPED) go back to open, its
--     synthesis allowance p_held is held again on it and its tenant
--     ('hold'; under a tenant budget at most what the tenant has
--     available, as ledger_open_run holds it), and its row and those
--     tasks' rows go back to RUNNING and PENDING, owned by p_owner, with
--     finished_at and result cleared. The tasks that ended keep their rows
--     and their closed accounts: they are never run again.
--
-- Nothing else reopens a run: a refund, a settle or a budget change never
-- does (docs/ledger.md#account-states).
--
-- Returns one row: outcome ok (continued now), replay (the key was used:
-- that continuation, with nothing written), conflict (the key was used
-- with another p_add), not_found (no such run of p_tenant), busy (the run
-- is ending: its account is exhausted, cancelled or closing; try again
-- once it has ended), ended (it ended in a state that is not continued:
-- info says which), over_cap (the limit would pass p_max_limit; info_tokens:
-- the most that may be added), too_small (the run could grant nothing
-- after it; info_tokens: the least p_add that could), exhausted (the
-- tenant's budget is below its minimum; info_tokens: what it has).
-- epoch is the run's owner epoch (run.adoptions): the new owner's fence.
CREATE OR REPLACE FUNCTION ledger_continue_run(p_run text, p_tenant text, p_key text, p_add bigint, p_held bigint,
                                               p_tasks text[], p_owner text, p_actor text, p_reason text,
                                               p_max_limit bigint)
RETURNS TABLE (outcome text, seq integer, added_tokens bigint, limit_after bigint, spent_before bigint,
               reopened boolean, task_ids text[], epoch bigint, info text, info_tokens bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
#variable_conflict use_column
DECLARE
    a        account;
    tenant   account;
    r        run;
    c        run_continuation;
    v_held   bigint := 0;
    v_avail  bigint;
    v_spent  bigint;
    v_seq    integer;
    v_reopen boolean := false;
BEGIN
    IF p_run IS NULL OR p_run = '' OR p_tenant IS NULL OR p_tenant = '' OR p_add IS NULL OR p_add <= 0
       OR p_key IS NULL OR p_key = '' OR octet_length(p_key) > 128 OR p_actor IS NULL OR p_actor = ''
       OR p_owner IS NULL OR p_owner = '' OR p_held IS NULL OR p_held < 0 OR p_max_limit IS NULL OR p_max_limit <= 0
       OR octet_length(coalesce(p_reason, '')) > 1024 THEN
        RAISE EXCEPTION 'ledger_continue_run: run %, tenant %, add %, held %, max limit % out of range',
            p_run, p_tenant, p_add, p_held, p_max_limit USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO a FROM account WHERE account.run_id = p_run AND account.kind = 'run';
    IF NOT FOUND OR a.tenant_id <> p_tenant THEN
        RETURN QUERY SELECT 'not_found', 0, 0::bigint, 0::bigint, 0::bigint, false, '{}'::text[], 0::bigint,
                            NULL::text, NULL::bigint;
        RETURN;
    END IF;
    -- The run's row first, then the chain, root first: the order in which
    -- a run's end takes them (ledger_check_owner locks the row, then the
    -- ledger function the chain).
    SELECT * INTO r FROM run WHERE run.run_id = p_run FOR UPDATE;
    SELECT * INTO a FROM ledger_lock_chain(a.chain) l WHERE l.account_id = a.account_id;
    SELECT * INTO c FROM run_continuation WHERE run_continuation.run_id = p_run
                                            AND run_continuation.idempotency_key = p_key;
    IF FOUND THEN
        RETURN QUERY SELECT CASE WHEN c.added_tokens = p_add THEN 'replay' ELSE 'conflict' END, c.seq,
                            c.added_tokens, c.limit_after, c.spent_before, c.reopened, c.task_ids, r.adoptions::bigint,
                            NULL::text, NULL::bigint;
        RETURN;
    END IF;
    IF a.funding IS NOT NULL THEN
        -- A child run's limit is what its funding holds on its parent task:
        -- raising it would spend what no account above it granted
        -- (docs/ledger.md#child-runs). Its root is continued instead.
        RETURN QUERY SELECT 'ended', 0, 0::bigint, 0::bigint, 0::bigint, false, '{}'::text[], 0::bigint,
                            'a child run'::text, NULL::bigint;
        RETURN;
    END IF;
    IF r.state = 'RUNNING' THEN
        IF a.state <> 'open' OR a.closing THEN
            RETURN QUERY SELECT 'busy', 0, 0::bigint, 0::bigint, 0::bigint, false, '{}'::text[], 0::bigint,
                                a.state, NULL::bigint;
            RETURN;
        END IF;
    ELSIF r.state = 'BUDGET_EXHAUSTED' THEN
        IF a.state <> 'closed' THEN
            RETURN QUERY SELECT 'busy', 0, 0::bigint, 0::bigint, 0::bigint, false, '{}'::text[], 0::bigint,
                                a.state, NULL::bigint;
            RETURN;
        END IF;
        v_reopen := true;
    ELSE
        RETURN QUERY SELECT 'ended', 0, 0::bigint, 0::bigint, 0::bigint, false, '{}'::text[], 0::bigint,
                            r.state, NULL::bigint;
        RETURN;
    END IF;
    IF a.limit_tokens + p_add > p_max_limit THEN
        RETURN QUERY SELECT 'over_cap', 0, 0::bigint, 0::bigint, 0::bigint, false, '{}'::text[], 0::bigint,
                            NULL::text, greatest(p_max_limit - a.limit_tokens, 0);
        RETURN;
    END IF;
    IF v_reopen THEN
        -- A task that ran is never granted again: its row says it never
        -- started and its account never reserved nor spent.
        IF coalesce(cardinality(p_tasks), 0) = 0
           OR EXISTS (SELECT FROM unnest(p_tasks) x
                       WHERE NOT EXISTS (SELECT FROM task WHERE task.run_id = p_run AND task.task_id = x
                                                           AND task.status IN ('NOT_STARTED', 'SKIPPED'))
                          OR EXISTS (SELECT FROM account t WHERE t.run_id = p_run AND t.kind = 'task' AND t.task_id = x
                                                            AND (t.spent <> 0 OR t.reserved <> 0))) THEN
            RAISE EXCEPTION 'ledger_continue_run: run % reopens only for tasks that are NOT_STARTED or SKIPPED (got %)',
                p_run, p_tasks USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_held := p_held;
        IF a.parent_id IS NOT NULL THEN
            SELECT * INTO tenant FROM account WHERE account.account_id = a.parent_id; -- locked with the chain
            IF ledger_available(tenant) < tenant.min_reservation THEN
                RETURN QUERY SELECT 'exhausted', 0, 0::bigint, 0::bigint, 0::bigint, false, '{}'::text[], 0::bigint,
                                    'tenant budget exhausted', ledger_available(tenant);
                RETURN;
            END IF;
            v_held := least(v_held, greatest(ledger_available(tenant), 0));
        END IF;
    END IF;
    v_avail := a.limit_tokens + p_add - a.reserved - a.spent - a.held - v_held;
    IF v_avail < a.min_reservation THEN
        RETURN QUERY SELECT 'too_small', 0, 0::bigint, 0::bigint, 0::bigint, false, '{}'::text[], 0::bigint,
                            NULL::text, p_add + a.min_reservation - v_avail;
        RETURN;
    END IF;
    v_spent := a.spent + coalesce((SELECT sum(s.spent - s.posted) FROM account s
                                    WHERE s.parent_id = a.account_id AND s.kind = 'task' AND s.cap_tokens IS NOT NULL), 0);

    UPDATE account SET limit_tokens = limit_tokens + p_add, updated_at = now() WHERE account.account_id = a.account_id;
    INSERT INTO ledger_entry (tenant_id, run_id, account_id, chain, kind, delta_limit, holder, note)
    VALUES (a.tenant_id, p_run, a.account_id, ARRAY[a.account_id], 'continue', p_add, p_actor,
            format('continued with %s tokens by %s (key %s)%s', p_add, p_actor, p_key,
                   CASE WHEN coalesce(p_reason, '') = '' THEN '' ELSE ': ' || p_reason END));
    IF v_reopen THEN
        UPDATE account SET state = 'open', cause = '', closing = false, updated_at = now()
         WHERE account.account_id = a.account_id;
        UPDATE account SET state = 'open', cause = '', updated_at = now()
         WHERE account.run_id = p_run AND account.kind = 'task' AND account.task_id = ANY (p_tasks);
        INSERT INTO ledger_entry (tenant_id, run_id, account_id, chain, kind, holder, note)
        VALUES (a.tenant_id, p_run, a.account_id, ARRAY[a.account_id], 'reopen', p_actor,
                format('the run reopens for %s tasks', cardinality(p_tasks)));
        IF v_held > 0 THEN
            UPDATE account SET held = held + v_held, updated_at = now() WHERE account.account_id = ANY (a.chain);
            INSERT INTO ledger_entry (tenant_id, run_id, account_id, chain, kind, delta_held, note)
            VALUES (a.tenant_id, p_run, a.account_id, a.chain, 'hold', v_held,
                    'held again for the continued run''s synthesis');
        END IF;
        UPDATE run SET state = 'RUNNING', cancel_cause = '', finished_at = NULL, result = NULL,
                       owner = p_owner, owner_heartbeat = now(), continued_at = now()
         WHERE run.run_id = p_run;
        UPDATE task SET status = 'PENDING', outcome = NULL, started_at = NULL, finished_at = NULL, worker = '',
                        tokens_spent = 0
         WHERE task.run_id = p_run AND task.task_id = ANY (p_tasks);
        -- Every node forgets what it heard of the run's end (budget.Watcher.Reopened).
        PERFORM pg_notify('fanout_run_state', 'open ' || p_run);
    END IF;
    v_seq := coalesce((SELECT max(x.seq) FROM run_continuation x WHERE x.run_id = p_run), 0) + 1;
    INSERT INTO run_continuation (run_id, seq, tenant_id, idempotency_key, added_tokens, limit_after, spent_before,
                                  reopened, task_ids, actor, reason)
    VALUES (p_run, v_seq, a.tenant_id, p_key, p_add, a.limit_tokens + p_add, v_spent, v_reopen,
            CASE WHEN v_reopen THEN p_tasks ELSE '{}' END, p_actor, coalesce(p_reason, ''));
    RETURN QUERY SELECT 'ok', v_seq, p_add, a.limit_tokens + p_add, v_spent, v_reopen,
                        CASE WHEN v_reopen THEN p_tasks ELSE '{}'::text[] END, r.adoptions::bigint,
                        NULL::text, NULL::bigint;
END $$;
REVOKE ALL ON FUNCTION ledger_continue_run(text,text,text,bigint,bigint,text[],text,text,text,bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_continue_run(text,text,text,bigint,bigint,text[],text,text,text,bigint) TO fanout_app;
