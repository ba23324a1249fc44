-- ledger_expire posts one held reservation whose lease ran out (database time)
-- as spent at its full amount, flagged estimated: spend that cannot be proven
-- unspent is counted. Its generation moves on, fencing the old holder.
CREATE OR REPLACE FUNCTION ledger_expire(p_reservation bigint) RETURNS ledger_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    r   reservation;
    res ledger_result;
BEGIN
    SELECT * INTO r FROM reservation WHERE reservation_id = p_reservation;
    IF NOT FOUND THEN
        res.outcome := 'not_found';
        RETURN res;
    END IF;
    IF r.state <> 'held' OR r.lease_expires_at > now() THEN
        -- Checked before any lock too: a call on a live lease locks nothing.
        RETURN ledger_result_of('replay', r);
    END IF;
    PERFORM FROM ledger_lock_reservation(r, false);
    SELECT * INTO r FROM reservation WHERE reservation_id = p_reservation FOR UPDATE;
    IF r.state <> 'held' OR r.lease_expires_at > now() THEN
        RETURN ledger_result_of('replay', r);
    END IF;
    UPDATE account SET reserved = reserved - r.amount, spent = spent + r.amount, updated_at = now()
     WHERE account_id = ANY (r.chain);
    UPDATE reservation SET state = 'expired', spent = r.amount, estimated = true,
                           generation = generation + 1, resolved_at = now()
     WHERE reservation_id = p_reservation RETURNING * INTO r;
    INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, reservation_id, kind,
                              delta_reserved, delta_spent, estimated, holder, model, note)
    SELECT r.tenant_id, r.run_id, l.task_id, r.account_id, r.chain, r.reservation_id, 'expire',
           -r.amount, r.amount, true, r.holder, r.model, 'lease expired; full reservation counted as spent'
      FROM account l WHERE l.account_id = r.account_id;
    PERFORM ledger_resolved(r);
    RETURN ledger_result_of('ok', r);
END $$;
REVOKE ALL ON FUNCTION ledger_expire(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_expire(bigint) TO fanout_app, fanout_worker;
