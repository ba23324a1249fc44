-- ledger_end_run moves a run toward p_state (cancelled or closed) and
-- notifies. A cancel moves an open or an exhausted run (whose calls may
-- still run under DRAIN) to cancelled. It never voids a held reservation
-- (its call may have spent): asked to close a run that still holds some, it
-- cancels an open run (nothing more is granted; an exhausted run stays
-- exhausted) and marks it closing; the run closes when the last held
-- reservation is settled by its holder or expired by the sweeper. What the
-- run held back for its synthesis is released, on the run's account and its
-- tenant's (an ended run draws on it no more), and its tasks' slices go
-- back to it (docs/ledger.md#budget-slices). Returns the run account.
CREATE OR REPLACE FUNCTION ledger_end_run(p_run text, p_state text, p_cause text)
RETURNS SETOF account
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    a account;
BEGIN
    IF p_state IS NULL OR p_state NOT IN ('cancelled', 'closed') THEN
        RAISE EXCEPTION 'ledger_end_run: state % is not cancelled or closed', p_state
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO a FROM account WHERE run_id = p_run AND kind = 'run';
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- Lock the run first: a reservation granted after the held ones were
    -- counted would otherwise outlive the close.
    SELECT * INTO a FROM ledger_lock_chain(a.chain) l WHERE l.account_id = a.account_id;
    IF a.state = 'closed' THEN
        RETURN QUERY SELECT * FROM account WHERE account_id = a.account_id;
        RETURN;
    END IF;
    IF a.held > 0 THEN
        UPDATE account SET held = held - a.held, updated_at = now() WHERE account_id = ANY (a.chain);
        INSERT INTO ledger_entry (tenant_id, run_id, account_id, chain, kind, delta_held, note)
        VALUES (a.tenant_id, p_run, a.account_id, a.chain, 'release', -a.held,
                format('the run ended %s; what it held for its synthesis is released', p_state));
        a.held := 0;
        PERFORM ledger_give_back(a.chain);
    END IF;
    -- Its tasks' slices go back, and what they spent is posted: what their
    -- held reservations hold stays carved until they resolve.
    PERFORM ledger_uncarve_many(array_agg(l.account_id ORDER BY l.account_id), true)
       FROM (SELECT account_id FROM account WHERE parent_id = a.account_id AND kind = 'task' AND cap_tokens IS NOT NULL
              ORDER BY account_id FOR UPDATE) AS l
     HAVING count(*) > 0;
    SELECT * INTO a FROM account WHERE account_id = a.account_id;
    IF p_state = 'closed' AND a.reserved = 0 THEN
        PERFORM ledger_close_run(a.account_id, p_cause);
    ELSE
        IF p_state = 'closed' THEN
            p_cause := 'run ended with reservations still held; it closes when they resolve';
        END IF;
        IF a.state = 'open' OR (a.state = 'exhausted' AND p_state = 'cancelled') THEN
            UPDATE account SET state = 'cancelled', cause = coalesce(p_cause, ''), updated_at = now()
             WHERE account_id = a.account_id;
            INSERT INTO ledger_entry (tenant_id, run_id, account_id, chain, kind, note)
            VALUES (a.tenant_id, p_run, a.account_id, ARRAY[a.account_id], 'cancel', coalesce(p_cause, ''));
            PERFORM ledger_mark_tasks(ARRAY[a.account_id], 'cancelled');
            PERFORM pg_notify('fanout_run_state', 'cancelled ' || p_run);
        END IF;
        IF p_state = 'closed' THEN
            UPDATE account SET closing = true, updated_at = now() WHERE account_id = a.account_id;
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM account WHERE account_id = a.account_id;
END $$;
REVOKE ALL ON FUNCTION ledger_end_run(text,text,text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_end_run(text,text,text) TO fanout_app;
