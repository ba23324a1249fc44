-- tool_cache_check says whether the session may use the result cache of
-- tenant p_tenant for task p_task of run p_run on account p_account: the
-- account is that task's (or the run's) of that tenant, and p_secret is
-- its current attempt's (ledger_secret_ok), and the account is open (a
-- task that ended, or a run that ended, reads and writes nothing more). A
-- worker's login so reads and writes the entries of the tenants of the
-- tasks dispatched to it, while they run, only; the tenant is the
-- dispatch's, never what a model sent.
CREATE OR REPLACE FUNCTION tool_cache_check(p_account bigint, p_tenant text, p_run text, p_task text, p_secret text)
RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    a account;
BEGIN
    SELECT * INTO a FROM account WHERE account_id = p_account;
    RETURN FOUND AND p_tenant IS NOT NULL AND a.tenant_id = p_tenant AND a.run_id IS NOT DISTINCT FROM p_run
        AND a.kind <> 'tenant' AND (a.kind <> 'task' OR a.task_id IS NOT DISTINCT FROM p_task)
        AND a.state = 'open' AND ledger_secret_ok(a.secret_hash, p_secret);
END $$;
REVOKE ALL ON FUNCTION tool_cache_check(bigint,text,text,text,text) FROM PUBLIC;
