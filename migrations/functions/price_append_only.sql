-- price_append_only refuses every change to a price row but an insert:
-- a correction is a new row (price_set), never an overwrite of history.
CREATE OR REPLACE FUNCTION price_append_only() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'price is append-only: % refused (set a correction with price_set and a reason)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;
REVOKE ALL ON FUNCTION price_append_only() FROM PUBLIC;

CREATE OR REPLACE TRIGGER price_no_truncate BEFORE TRUNCATE ON price
    FOR EACH STATEMENT EXECUTE FUNCTION price_append_only();

CREATE OR REPLACE TRIGGER price_no_update BEFORE UPDATE OR DELETE ON price
    FOR EACH ROW EXECUTE FUNCTION price_append_only();
