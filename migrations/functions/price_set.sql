-- price_set sets the price of p_model from p_effective_from on (replacing
-- a price set for that same instant) and logs the action. Returns the row.
CREATE OR REPLACE FUNCTION price_set(p_actor text, p_model text, p_effective_from timestamptz, p_in numeric, p_out numeric,
                          p_currency text DEFAULT 'USD')
RETURNS SETOF price
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    prior price;
BEGIN
    IF p_actor IS NULL OR p_actor = '' OR p_model IS NULL OR p_model = '' OR octet_length(p_model) > 256
       OR p_effective_from IS NULL OR p_in IS NULL OR p_in < 0 OR p_out IS NULL OR p_out < 0
       OR p_currency IS NULL OR p_currency !~ '^[A-Z]{3}$' THEN
        RAISE EXCEPTION 'price_set: actor %, model %, effective_from %, input % output % per million, currency % out of range (prices >= 0, currency 3 capital letters)',
            p_actor, p_model, p_effective_from, p_in, p_out, p_currency
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO prior FROM price WHERE model = p_model AND effective_from = p_effective_from FOR UPDATE;
    INSERT INTO price (model, effective_from, input_per_million, output_per_million, currency)
    VALUES (p_model, p_effective_from, p_in, p_out, p_currency)
    ON CONFLICT (model, effective_from) DO UPDATE
       SET input_per_million = excluded.input_per_million, output_per_million = excluded.output_per_million,
           currency = excluded.currency, set_at = now();
    PERFORM admin_log(p_actor, 'price.set', NULL,
        jsonb_build_object('model', p_model, 'effective_from', p_effective_from,
                           'input_per_million', p_in, 'output_per_million', p_out, 'currency', p_currency,
                           'replaced', CASE WHEN prior.model IS NULL THEN NULL ELSE to_jsonb(prior) END));
    RETURN QUERY SELECT * FROM price WHERE model = p_model AND effective_from = p_effective_from;
END $$;
REVOKE ALL ON FUNCTION price_set(text,text,timestamp with time zone,numeric,numeric,text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION price_set(text,text,timestamp with time zone,numeric,numeric,text) TO fanout_app;
