-- ledger_renew extends a held lease by p_ttl from now. p_secret is the
-- secret of the attempt that reserved it (ledger_secret_ok).
CREATE OR REPLACE FUNCTION ledger_renew(p_reservation bigint, p_generation bigint, p_ttl interval,
                             p_secret text DEFAULT NULL)
RETURNS ledger_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    r   reservation;
    res ledger_result;
BEGIN
    IF p_ttl IS NULL OR p_ttl <= interval '0' OR p_ttl > interval '1 hour' THEN
        RAISE EXCEPTION 'ledger_renew: ttl % out of range (at most 1 hour)', p_ttl USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE reservation SET lease_expires_at = now() + p_ttl
     WHERE reservation_id = p_reservation AND state = 'held'
       AND generation = p_generation AND lease_expires_at > now()
       AND ledger_secret_ok(secret_hash, p_secret)
    RETURNING * INTO r;
    IF FOUND THEN
        RETURN ledger_result_of('ok', r);
    END IF;
    SELECT * INTO r FROM reservation WHERE reservation_id = p_reservation;
    IF NOT FOUND THEN
        res.outcome := 'not_found';
        RETURN res;
    END IF;
    IF NOT ledger_secret_ok(r.secret_hash, p_secret) THEN
        RETURN ledger_refusal('denied', r.account_id, 'the reservation was not granted to this secret');
    END IF;
    res := ledger_result_of('lease_lost', r);
    res.info := format('reservation is %s at generation %s, lease until %s', r.state, r.generation, r.lease_expires_at);
    RETURN res;
END $$;
REVOKE ALL ON FUNCTION ledger_renew(bigint,bigint,interval,text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_renew(bigint,bigint,interval,text) TO fanout_app, fanout_worker;
