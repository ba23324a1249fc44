-- ledger_lock_reservation locks what resolving reservation r needs, root
-- first, and returns those accounts in that order: its chain, or, for a
-- call drawn on a task's slice (a chain that starts at a task account), the task's row
-- alone while the task is open, its period has not ended and p_full is
-- false, else the task's whole chain (a settle past the grant tops the
-- slice up; a run that ended posts the slice; docs/ledger.md#budget-slices).
-- A chain that changed since it was read is refused, to be retried.
CREATE OR REPLACE FUNCTION ledger_lock_reservation(r reservation, p_full boolean) RETURNS SETOF account
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    t account;
BEGIN
    SELECT * INTO t FROM account WHERE account_id = r.chain[1];
    IF t.kind = 'task' THEN
        IF NOT p_full AND ledger_slice_fits(t, 0, 0) THEN
            PERFORM set_config('fanout.slice_locked', 'on', true);
            SELECT * INTO t FROM account WHERE account_id = t.account_id FOR UPDATE;
            IF NOT ledger_slice_fits(t, 0, 0) THEN
                -- Its run ended (or its period) while this waited: the rows
                -- above are needed, and taking them now, after the task's,
                -- would break the root-first order. Retried, it takes them
                -- first.
                RAISE EXCEPTION 'ledger_lock_reservation: the slice of account % changed while it was locked; try again',
                    t.account_id USING ERRCODE = 'serialization_failure';
            END IF;
            RETURN NEXT t;
            RETURN;
        END IF;
        RETURN QUERY SELECT * FROM ledger_lock_chain(t.chain);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM ledger_lock_chain(r.chain);
END $$;
REVOKE ALL ON FUNCTION ledger_lock_reservation(reservation, boolean) FROM PUBLIC;
