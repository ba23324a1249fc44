-- ledger_begin_attempts begins an attempt on each of p_accounts, in array
-- order (callers pass account ids ascending, the order every batch of the
-- ledger locks task accounts in), as ledger_begin_attempt does for one,
-- and returns one row for each: the account with ledger_begin_attempt's
-- result. A new run's first dispatches are begun this way in the
-- transaction that opens it (store.Runs.OpenRun): one statement instead of
-- one transaction per task.
CREATE OR REPLACE FUNCTION ledger_begin_attempts(p_accounts bigint[], p_run text, p_tenant text)
RETURNS TABLE (account_id bigint, outcome text, attempt bigint, info_kind text, info_state text, secret text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
#variable_conflict use_column
DECLARE
    a bigint;
BEGIN
    FOREACH a IN ARRAY coalesce(p_accounts, '{}') LOOP
        RETURN QUERY SELECT a, b.outcome, b.attempt, b.info_kind, b.info_state, b.secret
                       FROM ledger_begin_attempt(a, p_run, p_tenant) AS b;
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION ledger_begin_attempts(bigint[],text,text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_begin_attempts(bigint[],text,text) TO fanout_app;
