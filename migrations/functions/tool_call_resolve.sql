-- tool_call_resolve moves the issued write tool call p_key to p_state
-- (done, failed, unknown or not_sent) with its result and error text, once. It
-- returns whether this call resolved it, and the state the call is in
-- (NULL when no call has the key). p_secret is the secret of the attempt
-- that issued it (ledger_secret_ok); a worker that does not hold it gets
-- 'denied' and changes nothing. A concurrent resolution is waited for and
-- then reported.
CREATE OR REPLACE FUNCTION tool_call_resolve(p_key text, p_state text, p_result text, p_error text,
                                  p_secret text DEFAULT NULL)
RETURNS TABLE (resolved boolean, state text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
#variable_conflict use_column
DECLARE
    c tool_call;
BEGIN
    SELECT * INTO c FROM tool_call WHERE key = p_key; -- the secret before the lock
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, NULL::text;
        RETURN;
    ELSIF NOT ledger_secret_ok(c.secret_hash, p_secret) THEN
        RETURN QUERY SELECT false, 'denied'::text;
        RETURN;
    END IF;
    SELECT * INTO c FROM tool_call WHERE key = p_key FOR UPDATE;
    IF c.state <> 'issued' THEN
        RETURN QUERY SELECT false, c.state;
    ELSE
        UPDATE tool_call SET state = p_state, result = p_result, error = p_error WHERE key = p_key;
        RETURN QUERY SELECT true, p_state;
    END IF;
END $$;
REVOKE ALL ON FUNCTION tool_call_resolve(text,text,text,text,text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tool_call_resolve(text,text,text,text,text) TO fanout_app, fanout_worker;
