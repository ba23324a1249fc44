-- ledger_lock_chain locks the accounts of chain root first (the only order
-- anyone locks them in) and returns them in that order.
CREATE OR REPLACE FUNCTION ledger_lock_chain(p_chain bigint[]) RETURNS SETOF account
LANGUAGE sql SET search_path = pg_catalog, fanout, pg_temp AS $$
    SELECT * FROM account WHERE account_id = ANY (p_chain)
     ORDER BY array_position(p_chain, account_id) FOR UPDATE
$$;
REVOKE ALL ON FUNCTION ledger_lock_chain(bigint[]) FROM PUBLIC;
