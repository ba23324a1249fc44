-- 0022: prices are append-only (issue 23, item 5). A price is never
-- overwritten: setting one effective in the past is a correction, a new
-- row with its reason, and the one it corrects stays. Who set each row is
-- kept on it as well as in admin_action. The effective price of a model at
-- an instant is the row with the latest effective_from at or before it,
-- the latest set of those (money_line).
ALTER TABLE fanout.price ADD COLUMN reason text, ADD COLUMN set_by text;
ALTER TABLE fanout.price ADD CONSTRAINT price_reason_check
    CHECK (reason IS NULL OR (reason <> '' AND octet_length(reason) <= 1024));
ALTER TABLE fanout.price DROP CONSTRAINT price_pkey;
ALTER TABLE fanout.price ADD CONSTRAINT price_pkey PRIMARY KEY (model, effective_from, set_at);
COMMENT ON TABLE fanout.price IS 'Price per million tokens of a model from effective_from on, until the next row of the model; of rows with one effective_from the latest set_at wins (a correction, with its reason). Append-only; written by price_set only.';
GRANT SELECT(reason, set_by) ON TABLE fanout.price TO fanout_auditor;
GRANT SELECT(reason) ON TABLE fanout.price TO fanout_tenant_auditor;
