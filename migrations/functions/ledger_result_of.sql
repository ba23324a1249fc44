CREATE OR REPLACE FUNCTION ledger_result_of(p_outcome text, r reservation) RETURNS ledger_result
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, fanout, pg_temp AS $$
    SELECT ROW(p_outcome, NULL, NULL, NULL, NULL, NULL,
               r.reservation_id, r.account_id, r.run_id, r.tenant_id, r.requested, r.amount,
               r.holder, r.generation, r.lease_expires_at, r.state, r.actual, r.spent,
               r.overrun, r.estimated, NULL, NULL)::ledger_result
$$;
REVOKE ALL ON FUNCTION ledger_result_of(text,reservation) FROM PUBLIC;
