-- ledger_refusal is a refusal outcome with its reason.
CREATE OR REPLACE FUNCTION ledger_refusal(p_outcome text, p_account bigint, p_info text) RETURNS ledger_result
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    res ledger_result;
BEGIN
    res.outcome := p_outcome;
    res.info_account := p_account;
    res.info := p_info;
    RETURN res;
END $$;
REVOKE ALL ON FUNCTION ledger_refusal(text,bigint,text) FROM PUBLIC;
