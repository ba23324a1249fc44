CREATE OR REPLACE FUNCTION ledger_renew(p_reservation bigint, p_generation bigint, p_ttl interval)
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
    RETURNING * INTO r;
    IF FOUND THEN
        RETURN ledger_result_of('ok', r);
    END IF;
    SELECT * INTO r FROM reservation WHERE reservation_id = p_reservation;
    IF NOT FOUND THEN
        res.outcome := 'not_found';
        RETURN res;
    END IF;
    res := ledger_result_of('lease_lost', r);
    res.info := format('reservation is %s at generation %s, lease until %s', r.state, r.generation, r.lease_expires_at);
    RETURN res;
END $$;
REVOKE ALL ON FUNCTION ledger_renew(bigint,bigint,interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_renew(bigint,bigint,interval) TO fanout_app, fanout_worker;
