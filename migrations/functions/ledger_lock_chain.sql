-- ledger_lock_chain locks the accounts of chain root first (the only order
-- anyone locks them in) and returns them in that order. A tenant account
-- whose budget period has ended is rolled over under its lock, before the
-- caller reads it: whichever statement is the first after the end (a
-- reserve, a settle, the sweeper's expiry, a void, a run's end), what it
-- posts counts in the new period, as database time says it should.
CREATE OR REPLACE FUNCTION ledger_lock_chain(p_chain bigint[]) RETURNS SETOF account
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    a account;
BEGIN
    FOR a IN SELECT * FROM account WHERE account_id = ANY (p_chain)
              ORDER BY array_position(p_chain, account_id) FOR UPDATE LOOP
        IF a.kind = 'tenant' THEN
            a := ledger_roll_period(a);
        END IF;
        RETURN NEXT a;
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION ledger_lock_chain(bigint[]) FROM PUBLIC;
