-- semaphore_renew moves the expiry of every slot lease p_lease of p_holder
-- still holds to now() + p_ttl and returns how many it renewed: fewer than
-- the lease's keys means a slot expired (and may have been taken).
CREATE OR REPLACE FUNCTION semaphore_renew(p_lease bigint, p_holder text, p_ttl interval) RETURNS int
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    n int;
BEGIN
    IF p_ttl IS NULL OR p_ttl <= interval '0' OR p_ttl > interval '1 hour' THEN
        RAISE EXCEPTION 'semaphore_renew: ttl % out of range (at most 1 hour)', p_ttl
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE semaphore_slot SET expires_at = now() + p_ttl
     WHERE lease_id = p_lease AND holder = p_holder
           AND (key NOT LIKE 'tenant-tasks:%' OR session_is_orchestrator()) AND expires_at > now();
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;
REVOKE ALL ON FUNCTION semaphore_renew(bigint,text,interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION semaphore_renew(bigint,text,interval) TO fanout_app, fanout_worker;
