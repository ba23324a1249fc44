-- ledger_lock_chain locks the accounts of chain root first, in the one
-- order (ledger_lock_accounts, which also rolls a tenant's ended period
-- over under its lock), and returns them in that order. A chain that
-- changed since the caller read it is refused, to be retried.
CREATE OR REPLACE FUNCTION ledger_lock_chain(p_chain bigint[]) RETURNS SETOF account
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    a account;
BEGIN
    FOR a IN SELECT * FROM ledger_lock_accounts(p_chain) LOOP
        RETURN NEXT a;
    END LOOP;
    -- The caller read p_chain before taking the locks: a run put under its
    -- tenant's budget meanwhile (ledger_adopt_runs) has a longer chain now,
    -- and a grant or settle on the old one would pass the tenant by.
    IF a.account_id IS NOT NULL AND a.chain IS DISTINCT FROM p_chain THEN
        RAISE EXCEPTION 'ledger_lock_chain: account %''s chain changed from % to % (its run was put under a tenant budget); try again',
            a.account_id, p_chain, a.chain USING ERRCODE = 'serialization_failure';
    END IF;
END $$;
REVOKE ALL ON FUNCTION ledger_lock_chain(bigint[]) FROM PUBLIC;
