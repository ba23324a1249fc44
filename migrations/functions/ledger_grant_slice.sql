-- ledger_grant_slice grants p_amount tokens (p_want asked) of the slice of
-- task account t, which the caller holds locked and has checked (open, of
-- the attempt and secret, the key new, p_amount within what the slice has
-- available): a reservation whose chain is the task's account alone, its
-- reserve entry, and the task's row. No row another node spends from is
-- touched (docs/ledger.md#budget-slices).
CREATE OR REPLACE FUNCTION ledger_grant_slice(t account, p_want bigint, p_amount bigint, p_holder text,
                                   p_ttl interval, p_key text, p_attempt bigint, p_model text)
RETURNS ledger_result
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    r   reservation;
    res ledger_result;
BEGIN
    UPDATE account SET reserved = reserved + p_amount, updated_at = now() WHERE account_id = t.account_id;
    INSERT INTO reservation (tenant_id, run_id, account_id, chain, requested, amount, holder,
                             lease_expires_at, reserve_key, attempt, model, secret_hash)
    VALUES (t.tenant_id, t.run_id, t.account_id, ARRAY[t.account_id], p_want, p_amount, p_holder,
            now() + p_ttl, p_key, p_attempt, nullif(p_model, ''), t.secret_hash)
    RETURNING * INTO r;
    INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, reservation_id,
                              kind, delta_reserved, holder, model)
    VALUES (t.tenant_id, t.run_id, t.task_id, t.account_id, ARRAY[t.account_id],
            r.reservation_id, 'reserve', p_amount, p_holder, r.model);
    res := ledger_result_of('ok', r);
    res.wind_down := t.wind_down;
    RETURN res;
END $$;
REVOKE ALL ON FUNCTION ledger_grant_slice(account,bigint,bigint,text,interval,text,bigint,text) FROM PUBLIC;
