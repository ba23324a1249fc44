-- ledger_below_minimum is the exhaustion threshold: whether account a, with
-- p_more tokens more reserved, has less available than its
-- min_reservation (strictly: an account left at exactly its minimum can
-- still grant it). A run below it is exhausted; a tenant below it grants
-- nothing to any run under it (docs/ledger.md#availability-and-exhaustion).
CREATE OR REPLACE FUNCTION ledger_below_minimum(a account, p_more bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ledger_available(a) - p_more < a.min_reservation;
REVOKE ALL ON FUNCTION ledger_below_minimum(account,bigint) FROM PUBLIC;
