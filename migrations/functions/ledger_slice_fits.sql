-- ledger_slice_fits says whether a call of p_want tokens (p_pending more
-- already taken by calls before it in the same batch) can be paid from the
-- slice of task account t alone, by what t says: t is sliced and open,
-- its period has not ended, and its slice has the tokens. Such a call
-- locks the task's row only; any other takes the chain's locks, root first
-- (docs/ledger.md#budget-slices).
CREATE OR REPLACE FUNCTION ledger_slice_fits(t account, p_pending bigint, p_want bigint) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
RETURN coalesce(t.cap_tokens IS NOT NULL AND t.state = 'open'
                AND (t.slice_until IS NULL OR now() < t.slice_until)
                AND ledger_available(t) - p_pending >= p_want, false);
REVOKE ALL ON FUNCTION ledger_slice_fits(account,bigint,bigint) FROM PUBLIC;
