-- tool_call_send moves an approved write tool call p_key of task p_task to
-- issued, just before it is sent, by the task's current attempt p_attempt
-- on account p_account (p_secret is that attempt's, ledger_secret_ok): the
-- attempt that asked for the approval, or a later one that found the
-- call by its tool and arguments after a re-dispatch. The call then
-- resolves with that attempt's secret. Returns sent (also for a retry that
-- finds the call sent by this attempt), superseded, forbidden (not this
-- task's call, or not this attempt's secret), or the call's state when it
-- is not approved (awaiting_approval, denied, ...). tool_call_transition
-- refuses the move unless an approval of the call is recorded. Once the
-- run's ledger account is no longer open (exhausted, cancelled, closed) an
-- approved call is denied instead ("denied: run ended"): between the
-- cancel's commit and the run's close, no approval sends a write.
CREATE OR REPLACE FUNCTION tool_call_send(p_account bigint, p_key text, p_tenant text, p_run text, p_task text,
                                          p_attempt bigint, p_secret text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    a account;
    c tool_call;
BEGIN
    SELECT * INTO a FROM account WHERE account_id = p_account;
    SELECT * INTO c FROM tool_call WHERE key = p_key;
    IF a.account_id IS NULL OR c.key IS NULL
       OR (a.run_id, a.tenant_id) IS DISTINCT FROM (p_run, p_tenant)
       OR a.kind = 'tenant' OR (a.kind = 'task' AND a.task_id IS DISTINCT FROM p_task)
       OR (c.tenant_id, c.run_id, c.task_id) IS DISTINCT FROM (p_tenant, p_run, p_task) THEN
        RETURN 'forbidden';
    END IF;
    IF a.attempt IS DISTINCT FROM p_attempt THEN
        RETURN 'superseded';
    ELSIF NOT ledger_secret_ok(a.secret_hash, p_secret) THEN
        RETURN 'forbidden';
    END IF;
    SELECT * INTO a FROM account WHERE account_id = p_account FOR SHARE; -- as tool_call_issue
    SELECT * INTO c FROM tool_call WHERE key = p_key FOR UPDATE;
    IF a.attempt IS DISTINCT FROM p_attempt THEN
        RETURN 'superseded';
    ELSIF c.state = 'issued' AND coalesce(c.sent_attempt, c.attempt) = p_attempt THEN
        RETURN 'sent';
    ELSIF c.state <> 'approved' THEN
        RETURN c.state;
    ELSIF (SELECT r.state FROM account r WHERE r.run_id = p_run AND r.kind = 'run') IS DISTINCT FROM 'open' THEN
        UPDATE tool_call SET state = 'denied', error = 'denied: run ended' WHERE key = p_key;
        RETURN 'denied';
    END IF;
    UPDATE tool_call SET state = 'issued', secret_hash = a.secret_hash, sent_attempt = p_attempt WHERE key = p_key;
    RETURN 'sent';
END $$;
REVOKE ALL ON FUNCTION tool_call_send(bigint,text,text,text,text,bigint,text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tool_call_send(bigint,text,text,text,text,bigint,text) TO fanout_app, fanout_worker;
