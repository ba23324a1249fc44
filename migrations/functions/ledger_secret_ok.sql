-- ledger_secret_ok says whether the session may act on what an attempt
-- holds (an account's current attempt, a reservation or a tool call made
-- under one) whose secret hashes to p_hash: a worker's login must present
-- the secret, which only the dispatch of that attempt carried. An
-- orchestrator's login and the owner are not asked
-- (session_is_orchestrator): they begin attempts, so they could make a
-- secret anyway.
CREATE OR REPLACE FUNCTION ledger_secret_ok(p_hash bytea, p_secret text) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    RETURN (p_hash IS NOT NULL AND p_secret IS NOT NULL AND p_hash = sha256(convert_to(p_secret, 'UTF8')))
        OR session_is_orchestrator();
END $$;
REVOKE ALL ON FUNCTION ledger_secret_ok(bytea,text) FROM PUBLIC;
