-- ledger_available is what account a has left to grant: its limit less what
-- reservations on it or below it hold, what they spent, and what its runs
-- hold for their synthesis (docs/ledger.md#availability-and-exhaustion).
-- Every ledger function reads availability through it, and the planner
-- inlines it, so it costs nothing over the expression.
CREATE OR REPLACE FUNCTION ledger_available(a account) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN a.limit_tokens - a.reserved - a.spent - a.held;
REVOKE ALL ON FUNCTION ledger_available(account) FROM PUBLIC;
