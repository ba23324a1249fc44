-- ledger_begin_attempts begins an attempt on each of p_accounts (distinct
-- task account ids), as ledger_begin_attempt does for one, and returns one
-- row for each: the account with ledger_begin_attempt's result. A run's
-- own account (its synthesis) is refused: ledger_begin_attempt begins it,
-- alone, so that no call locks it after its tasks' accounts. A new run's first dispatches are begun this way in the
-- transaction that opens it (store.Runs.OpenRun): one statement instead of
-- one transaction per task.
--
-- The open task accounts of open run p_run are begun set-based: locked in
-- account_id order (the order every batch of the ledger locks task accounts
-- in), then bumped by one UPDATE; any other account (not found, not the
-- run's, not open, the run's own) gets ledger_begin_attempt's own answer.
-- Each sliced task account begun is given its slice, as ledger_begin_attempt
-- does, in one set-based carve (ledger_carve_many) under its run's chain's
-- locks taken first.
CREATE OR REPLACE FUNCTION ledger_begin_attempts(p_accounts bigint[], p_run text, p_tenant text)
RETURNS TABLE (account_id bigint, outcome text, attempt bigint, info_kind text, info_state text, secret text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
#variable_conflict use_column
DECLARE
    run      account;
    ids      bigint[] := '{}';
    attempts bigint[] := '{}';
    secrets  text[] := '{}';
BEGIN
    IF array_position(p_accounts, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'ledger_begin_attempts: the accounts % include NULL', p_accounts
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (SELECT count(DISTINCT u) FROM unnest(p_accounts) AS u) <> coalesce(cardinality(p_accounts), 0) THEN
        RAISE EXCEPTION 'ledger_begin_attempts: the accounts % are not distinct', p_accounts
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT FROM account a WHERE a.account_id = ANY (p_accounts) AND a.kind <> 'task') THEN
        RAISE EXCEPTION 'ledger_begin_attempts: the accounts % include one that is not a task''s (begin it with ledger_begin_attempt)', p_accounts
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT FROM account a WHERE a.account_id = ANY (p_accounts) AND a.cap_tokens IS NOT NULL) THEN
        -- Sliced tasks' slices are carved below, from their run: the
        -- run's chain is locked first, root first.
        SELECT * INTO run FROM account a WHERE a.run_id = p_run AND a.kind = 'run';
        PERFORM FROM ledger_lock_chain(run.chain);
    END IF;
    PERFORM 1 FROM account a
      WHERE a.account_id = ANY (p_accounts) AND a.kind = 'task' AND a.run_id = p_run AND a.tenant_id = p_tenant
      ORDER BY a.account_id FOR UPDATE;
    SELECT * INTO run FROM account a WHERE a.run_id = p_run AND a.kind = 'run';
    IF run.state = 'open' AND run.tenant_id = p_tenant THEN
        WITH s AS (
            SELECT u.id, replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '') AS secret
              FROM unnest(p_accounts) AS u(id)),
        upd AS (
            UPDATE account a SET attempt = a.attempt + 1, secret_hash = sha256(convert_to(s.secret, 'UTF8')), updated_at = now()
              FROM s
             WHERE a.account_id = s.id AND a.kind = 'task' AND a.run_id = p_run AND a.tenant_id = p_tenant
               AND a.state = 'open'
            RETURNING a.account_id, a.attempt, s.secret)
        SELECT coalesce(array_agg(upd.account_id), '{}'), coalesce(array_agg(upd.attempt), '{}'),
               coalesce(array_agg(upd.secret), '{}')
          INTO ids, attempts, secrets FROM upd;
        -- As ledger_begin_attempt: a cancel that committed while the
        -- UPDATE waited changed only the run's row.
        SELECT * INTO run FROM account a WHERE a.run_id = p_run AND a.kind = 'run';
        IF run.state = 'open' THEN
            -- Each sliced task begun gets its slice, in account order.
            PERFORM ledger_carve_many(ids);
        END IF;
    END IF;
    RETURN QUERY
        SELECT u.id,
               CASE WHEN run.state = 'open' THEN 'ok' ELSE 'exhausted' END,
               CASE WHEN run.state = 'open' THEN b.attempt ELSE 0 END,
               CASE WHEN run.state = 'open' THEN 'task' ELSE 'run' END,
               run.state,
               CASE WHEN run.state = 'open' THEN b.secret END
          FROM unnest(p_accounts) WITH ORDINALITY AS u(id, n)
          JOIN unnest(ids, attempts, secrets) AS b(id, attempt, secret) ON b.id = u.id
         ORDER BY u.n;
    RETURN QUERY
        SELECT u.id, r.outcome, r.attempt, r.info_kind, r.info_state, r.secret
          FROM unnest(p_accounts) WITH ORDINALITY AS u(id, n), LATERAL ledger_begin_attempt(u.id, p_run, p_tenant) AS r
         WHERE u.id <> ALL (ids)
         ORDER BY u.n;
END $$;
REVOKE ALL ON FUNCTION ledger_begin_attempts(bigint[],text,text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_begin_attempts(bigint[],text,text) TO fanout_app;
