-- ledger_settle_funding posts what the closed child run p_run spent on the
-- task it was carved from (docs/ledger.md#child-runs): its funding
-- reservation is settled at the child's spent (which counts its own
-- children's, settled the same way before it closed), estimated if any of
-- the child's spend was, and the rest of the grant goes back to the task
-- and every account above it. So a parent's spent is its own plus its
-- children's, at every level. Idempotent (a second call is the settle's
-- replay); a child not yet closed is a conflict (what it spends is not
-- final), a run that is not a child is not_found. Orchestrators only.
CREATE OR REPLACE FUNCTION ledger_settle_funding(p_run text) RETURNS ledger_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    c account;
    r reservation;
BEGIN
    SELECT * INTO c FROM account WHERE run_id = p_run AND kind = 'run' AND funding IS NOT NULL;
    IF NOT FOUND THEN
        RETURN ledger_refusal('not_found', NULL, format('run %s is not a child run', p_run));
    END IF;
    IF c.state <> 'closed' THEN
        RETURN ledger_refusal('conflict', c.account_id,
            format('child run %s is %s, not closed: what it spends is not final', p_run, c.state));
    END IF;
    SELECT * INTO r FROM reservation WHERE reservation_id = c.funding;
    RETURN ledger_settle(r.reservation_id, r.generation, c.spent,
                         EXISTS (SELECT FROM ledger_entry WHERE run_id = p_run AND estimated), NULL, 0, 0, NULL);
END $$;
REVOKE ALL ON FUNCTION ledger_settle_funding(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_settle_funding(text) TO fanout_app;
