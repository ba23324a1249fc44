-- ledger_void frees a held reservation whole, exactly once. p_secret is
-- the secret of the attempt that reserved it (ledger_secret_ok).
CREATE OR REPLACE FUNCTION ledger_void(p_reservation bigint, p_generation bigint, p_note text,
                            p_secret text DEFAULT NULL)
RETURNS ledger_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    r      reservation;
    res    ledger_result;
    rehold bigint;
BEGIN
    SELECT * INTO r FROM reservation WHERE reservation_id = p_reservation;
    IF NOT FOUND THEN
        res.outcome := 'not_found';
        RETURN res;
    END IF;
    IF NOT ledger_secret_ok(r.secret_hash, p_secret) THEN
        RETURN ledger_refusal('denied', r.account_id, 'the reservation was not granted to this secret');
    END IF;
    PERFORM FROM ledger_lock_reservation(r, false);
    SELECT * INTO r FROM reservation WHERE reservation_id = p_reservation FOR UPDATE;
    IF r.state = 'voided' THEN
        RETURN ledger_result_of('replay', r);
    ELSIF r.state = 'expired' OR (p_generation IS NOT NULL AND r.generation <> p_generation) THEN
        res := ledger_result_of('lease_lost', r);
        res.info := format('reservation is %s at generation %s; void came with generation %s', r.state, r.generation, p_generation);
        RETURN res;
    ELSIF r.state = 'settled' THEN
        res := ledger_result_of('conflict', r);
        res.info := 'reservation was already settled';
        RETURN res;
    END IF;
    UPDATE account SET reserved = reserved - r.amount, updated_at = now()
     WHERE account_id = ANY (r.chain);
    rehold := ledger_rehold(r, r.amount);
    PERFORM ledger_give_back(r.chain);
    UPDATE reservation SET state = 'voided', resolved_at = now()
     WHERE reservation_id = p_reservation RETURNING * INTO r;
    INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, reservation_id, kind,
                              delta_reserved, delta_held, holder, note)
    SELECT r.tenant_id, r.run_id, l.task_id, r.account_id, r.chain, r.reservation_id, 'void',
           -r.amount, rehold, r.holder, coalesce(p_note, '')
      FROM account l WHERE l.account_id = r.account_id;
    PERFORM ledger_resolved(r);
    RETURN ledger_result_of('ok', r);
END $$;
REVOKE ALL ON FUNCTION ledger_void(bigint,bigint,text,text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_void(bigint,bigint,text,text) TO fanout_app, fanout_worker;
