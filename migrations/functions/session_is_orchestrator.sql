-- session_is_orchestrator says whether the session's login is an
-- orchestrator's (a member of fanout_app) or the schema's owner: the
-- logins that begin attempts and hold tenants' task slots. A worker's login
-- (fanout_worker) is not: it must prove each attempt it acts on
-- (ledger_secret_ok) and cannot touch a tenant's task slots. It compares
-- with the schema's owner by name, not with current_user, so that it means
-- the same called from any function.
CREATE OR REPLACE FUNCTION session_is_orchestrator() RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, fanout, pg_temp AS $$
    SELECT pg_has_role(session_user, 'fanout_app', 'USAGE')
        OR pg_has_role(session_user, (SELECT nspowner FROM pg_namespace WHERE nspname = 'fanout'), 'USAGE')
$$;
REVOKE ALL ON FUNCTION session_is_orchestrator() FROM PUBLIC;
