-- ledger_result_of is the ledger_result that reports reservation r with
-- outcome p_outcome. It is PL/pgSQL, not SQL, although it is one
-- expression: a SQL function with a SET clause is never inlined, and is
-- parsed and planned again at every call (92 us of a 564 us ledger_reserve,
-- measured with track_functions); PL/pgSQL keeps the expression's plan for
-- the session.
CREATE OR REPLACE FUNCTION ledger_result_of(p_outcome text, r reservation) RETURNS ledger_result
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    RETURN ROW(p_outcome, NULL, NULL, NULL, NULL, NULL,
               r.reservation_id, r.account_id, r.run_id, r.tenant_id, r.requested, r.amount,
               r.holder, r.generation, r.lease_expires_at, r.state, r.actual, r.spent,
               r.overrun, r.estimated, NULL, NULL)::ledger_result;
END $$;
REVOKE ALL ON FUNCTION ledger_result_of(text,reservation) FROM PUBLIC;
