-- admin_check_quotas raises unless the quotas are in the ranges of the
-- tenant table's CHECKs (NULL: no cap).
CREATE OR REPLACE FUNCTION admin_check_quotas(p_max_run_tokens bigint, p_max_concurrent_runs int,
                                   p_max_tasks_in_flight int, p_key_requests_per_minute int,
                                   p_headroom double precision DEFAULT NULL) RETURNS void
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    IF p_max_run_tokens <= 0 THEN
        RAISE EXCEPTION 'max_run_tokens: must be > 0 (or none), got %', p_max_run_tokens
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF p_max_concurrent_runs < 0 THEN
        RAISE EXCEPTION 'max_concurrent_runs: must be >= 0 (or none), got %', p_max_concurrent_runs
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF p_max_tasks_in_flight <= 0 OR p_max_tasks_in_flight >= 10000 THEN
        RAISE EXCEPTION 'max_tasks_in_flight: must be in 1..9999 (or none), got %', p_max_tasks_in_flight
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF p_key_requests_per_minute <= 0 THEN
        RAISE EXCEPTION 'key_requests_per_minute: must be > 0 (or none), got %', p_key_requests_per_minute
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF p_headroom <= 0 OR p_headroom > 1 OR p_headroom = 'NaN' THEN
        RAISE EXCEPTION 'headroom: must be in (0, 1] (or none), got %', p_headroom
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;
REVOKE ALL ON FUNCTION admin_check_quotas(bigint,integer,integer,integer,double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION admin_check_quotas(bigint,integer,integer,integer,double precision) TO fanout_admin;
