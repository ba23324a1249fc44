-- semaphore_release frees the slots of lease p_lease of p_holder: at once
-- with p_grace 0, else at now() + p_grace (the call may still run on the
-- server). It returns how many slots the lease had; a slot another lease
-- took after this one expired is not touched.
CREATE OR REPLACE FUNCTION semaphore_release(p_lease bigint, p_holder text, p_grace interval) RETURNS int
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    n int;
BEGIN
    IF p_grace IS NULL OR p_grace < interval '0' OR p_grace > interval '1 hour' THEN
        RAISE EXCEPTION 'semaphore_release: grace % out of range (0 to 1 hour)', p_grace
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_grace = interval '0' THEN
        UPDATE semaphore_slot SET lease_id = NULL, expires_at = '-infinity'
         WHERE lease_id = p_lease AND holder = p_holder
           AND (key NOT LIKE 'tenant-tasks:%' OR session_is_orchestrator());
    ELSE
        UPDATE semaphore_slot SET expires_at = now() + p_grace
         WHERE lease_id = p_lease AND holder = p_holder
           AND (key NOT LIKE 'tenant-tasks:%' OR session_is_orchestrator());
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;
REVOKE ALL ON FUNCTION semaphore_release(bigint,text,interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION semaphore_release(bigint,text,interval) TO fanout_app, fanout_worker;
