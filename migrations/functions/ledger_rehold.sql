-- ledger_rehold gives p_amount tokens of reservation r, which drew on what
-- its run holds for its synthesis (from_held), back to held on its chain
-- (the run's account and its tenant's), while the run may still draw on
-- it: open or exhausted, not cancelled, closed or closing (an ended run has
-- released what it held: ledger_end_run). It returns what it gave back, for
-- the caller's entry's delta_held; 0 for any other reservation. Callers
-- hold the chain's locks, after their own update.
CREATE OR REPLACE FUNCTION ledger_rehold(r reservation, p_amount bigint) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    IF NOT r.from_held OR p_amount <= 0 THEN
        RETURN 0;
    END IF;
    IF NOT EXISTS (SELECT FROM account WHERE account_id = r.account_id AND kind = 'run'
                      AND state IN ('open', 'exhausted') AND NOT closing) THEN
        RETURN 0;
    END IF;
    UPDATE account SET held = held + p_amount, updated_at = now() WHERE account_id = ANY (r.chain);
    RETURN p_amount;
END $$;
REVOKE ALL ON FUNCTION ledger_rehold(reservation, bigint) FROM PUBLIC;
