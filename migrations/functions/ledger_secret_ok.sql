-- ledger_secret_ok says whether the session may act on what an attempt
-- holds (an account's current attempt, a reservation or a tool call made
-- under one) whose secret hashes to p_hash: a worker's login must present
-- the secret, which only the dispatch of that attempt carried. An
-- orchestrator's login (fanout_app) and the owner are not asked: they
-- begin attempts, so they could make a secret anyway.
CREATE OR REPLACE FUNCTION ledger_secret_ok(p_hash bytea, p_secret text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, fanout, pg_temp AS $$
    SELECT (p_hash IS NOT NULL AND p_secret IS NOT NULL AND p_hash = sha256(convert_to(p_secret, 'UTF8')))
        OR pg_has_role(session_user, 'fanout_app', 'USAGE')
        OR pg_has_role(session_user, current_user, 'USAGE')
$$;
REVOKE ALL ON FUNCTION ledger_secret_ok(bytea,text) FROM PUBLIC;
