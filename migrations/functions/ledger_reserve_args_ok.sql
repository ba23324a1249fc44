-- ledger_reserve_args_ok says whether a reserve's arguments are in range:
-- 0 < p_min <= p_want, a holder, an attempt from 1, a lease of more than 0
-- and at most an hour, a model name of at most 256 bytes. ledger_reserve
-- refuses a call outside them (22023); ledger_reserve_batch hands such a
-- call to ledger_reserve.
CREATE OR REPLACE FUNCTION ledger_reserve_args_ok(p_want bigint, p_min bigint, p_holder text, p_attempt bigint,
                                                  p_ttl interval, p_model text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(p_want > 0 AND p_min > 0 AND p_min <= p_want AND p_holder <> '' AND p_attempt >= 1
                AND p_ttl > interval '0' AND p_ttl <= interval '1 hour'
                AND coalesce(octet_length(p_model), 0) <= 256, false);
REVOKE ALL ON FUNCTION ledger_reserve_args_ok(bigint,bigint,text,bigint,interval,text) FROM PUBLIC;
