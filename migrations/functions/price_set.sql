-- price_set adds the price of p_model from p_effective_from on and logs
-- the action; it never changes a row (price is append-only). A price
-- effective before now is a correction of what spend was priced at: it
-- needs p_reason, and the rows it supersedes stay. Returns the new row.
CREATE OR REPLACE FUNCTION price_set(p_actor text, p_model text, p_effective_from timestamptz, p_in numeric, p_out numeric,
                          p_currency text DEFAULT 'USD', p_reason text DEFAULT NULL)
RETURNS SETOF price
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    prior price;
BEGIN
    IF p_actor IS NULL OR p_actor = '' OR p_model IS NULL OR p_model = '' OR octet_length(p_model) > 256
       OR p_effective_from IS NULL OR p_in IS NULL OR p_in < 0 OR p_out IS NULL OR p_out < 0
       OR p_currency IS NULL OR p_currency !~ '^[A-Z]{3}$'
       OR (p_reason IS NOT NULL AND (p_reason = '' OR octet_length(p_reason) > 1024)) THEN
        RAISE EXCEPTION 'price_set: actor %, model %, effective_from %, input % output % per million, currency %, reason of % bytes out of range (prices >= 0, currency 3 capital letters, reason 1..1024 bytes)',
            p_actor, p_model, p_effective_from, p_in, p_out, p_currency, octet_length(p_reason)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_effective_from < now() AND p_reason IS NULL THEN
        RAISE EXCEPTION 'price_set: reason: a price effective from % (before now, %) corrects what spend was priced at: give the reason',
            p_effective_from, now() USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO prior FROM price WHERE model = p_model AND effective_from <= p_effective_from
     ORDER BY effective_from DESC, set_at DESC LIMIT 1;
    INSERT INTO price (model, effective_from, input_per_million, output_per_million, currency, reason, set_by)
    VALUES (p_model, p_effective_from, p_in, p_out, p_currency, p_reason, p_actor);
    PERFORM admin_log(p_actor, CASE WHEN p_reason IS NULL THEN 'price.set' ELSE 'price.correct' END, NULL,
        jsonb_build_object('model', p_model, 'effective_from', p_effective_from,
                           'input_per_million', p_in, 'output_per_million', p_out, 'currency', p_currency,
                           'reason', p_reason,
                           'supersedes', CASE WHEN prior.model IS NULL THEN NULL ELSE to_jsonb(prior) END));
    RETURN QUERY SELECT * FROM price WHERE model = p_model AND effective_from = p_effective_from AND set_at = now();
END $$;
REVOKE ALL ON FUNCTION price_set(text,text,timestamp with time zone,numeric,numeric,text,text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION price_set(text,text,timestamp with time zone,numeric,numeric,text,text) TO fanout_admin;
