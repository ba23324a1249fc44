-- ledger_grant_on is the grant rule on one account of a chain: a grant of
-- p_g so far (at least p_min) shrinks to what account a has available, less
-- p_pending (what grants not yet written take from it), or is refused
-- (NULL) when a is not open, has less than p_min, or is a tenant account
-- below its min_reservation (docs/ledger.md#availability-and-exhaustion).
-- A reserve applies it to every account of its chain, root first.
CREATE OR REPLACE FUNCTION ledger_grant_on(a account, p_pending bigint, p_g bigint, p_min bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN a.state = 'open'
                 AND least(p_g, ledger_available(a) - p_pending) >= p_min
                 AND (a.kind <> 'tenant' OR NOT ledger_below_minimum(a, p_pending))
            THEN least(p_g, ledger_available(a) - p_pending) END;
REVOKE ALL ON FUNCTION ledger_grant_on(account,bigint,bigint,bigint) FROM PUBLIC;
