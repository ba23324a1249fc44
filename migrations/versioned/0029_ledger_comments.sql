-- 0029: the ledger's core columns say what they mean (issue 42), as
-- docs/ledger.md does: the account tree and chain, availability, the
-- account and reservation states and the journal's deltas. Comments only:
-- nothing a function or a query reads changes.

COMMENT ON TABLE fanout.account IS 'The ledger''s accounts: one per tenant with a budget, run and task (docs/ledger.md#the-account-tree). Changed only by the ledger_* functions.';
COMMENT ON COLUMN fanout.account.parent_id IS 'The account above: a task''s run, a run''s tenant account (NULL: a run without one, or a tenant account).';
COMMENT ON COLUMN fanout.account.chain IS 'The account ids from the root of the tree down to this one ([tenant, run, task]); locks are taken in this order, root first (docs/ledger.md#chain-and-lock-order).';
COMMENT ON COLUMN fanout.account.kind IS 'tenant, run or task.';
COMMENT ON COLUMN fanout.account.limit_tokens IS 'What the account may spend. available = limit_tokens - reserved - spent - held, on this account and every one of its chain (docs/ledger.md#availability-and-exhaustion).';
COMMENT ON COLUMN fanout.account.reserved IS 'Tokens held reservations on this account or below it hold (granted, not yet settled, voided or expired).';
COMMENT ON COLUMN fanout.account.spent IS 'Tokens resolved reservations on this account or below it posted: settled (the provider''s count, or the whole grant when unknown) or expired (the whole grant, estimated).';
COMMENT ON COLUMN fanout.account.min_reservation IS 'Run and tenant accounts: exhausted once available is below it (a tenant below it grants nothing to any of its runs); a task account''s is not used.';
COMMENT ON COLUMN fanout.account.state IS 'open, exhausted, cancelled or closed (docs/ledger.md#account-states); closed is terminal and nothing returns to open.';
COMMENT ON COLUMN fanout.account.cause IS 'Why the account left open, in words (for example "tenant budget exhausted").';
COMMENT ON COLUMN fanout.account.attempt IS 'Task accounts: the current dispatch of the task (ledger_begin_attempt); a grant to an older attempt is denied (fencing, docs/ledger.md#i9-fencing).';
COMMENT ON COLUMN fanout.account.closing IS 'Run accounts: the run has ended and closes when its last held reservation resolves.';

COMMENT ON TABLE fanout.reservation IS 'Grants of tokens for one call: held under a lease until settled, voided or expired, once (docs/ledger.md#reservation-states).';
COMMENT ON COLUMN fanout.reservation.chain IS 'The chain of the account it was granted on, copied at the grant: every account of it carries amount in reserved while it is held.';
COMMENT ON COLUMN fanout.reservation.requested IS 'What the caller asked for.';
COMMENT ON COLUMN fanout.reservation.amount IS 'What was granted: at most requested, at most what every account of the chain had available.';
COMMENT ON COLUMN fanout.reservation.holder IS 'The process that holds the lease.';
COMMENT ON COLUMN fanout.reservation.generation IS 'The lease''s generation: a settle, void or renewal names it, and an expiry moves it on (a stale holder is fenced).';
COMMENT ON COLUMN fanout.reservation.lease_expires_at IS 'When the lease ends (database time, at most an hour ahead); after it the sweeper expires the reservation and posts amount as estimated spend.';
COMMENT ON COLUMN fanout.reservation.state IS 'held, settled, voided or expired; resolved_at is set exactly when it is not held, and a resolved reservation never grants again.';
COMMENT ON COLUMN fanout.reservation.actual IS 'Settled: the tokens the provider reported (overrun: what it spent beyond amount, paid from what was available).';
COMMENT ON COLUMN fanout.reservation.spent IS 'What the reservation posted to spent when it resolved.';
COMMENT ON COLUMN fanout.reservation.estimated IS 'The spend posted is not the provider''s count: a call cut off or with unknown usage, settled whole, or an expired lease.';
COMMENT ON COLUMN fanout.reservation.reserve_key IS 'The caller''s idempotency key: a reserve retried with it gets the first answer (replay), never a second grant.';
COMMENT ON COLUMN fanout.reservation.from_held IS 'Drawn on the run''s held synthesis allowance instead of what is available.';

COMMENT ON TABLE fanout.ledger_entry IS 'The journal: every change of an account, appended in the transaction that makes it, never updated or deleted (docs/ledger.md#the-journal). An entry''s deltas count on every account of its chain.';
COMMENT ON COLUMN fanout.ledger_entry.kind IS 'open, hold, reserve, settle, void, expire, release, period, adjust, exhaust, cancel or close.';
COMMENT ON COLUMN fanout.ledger_entry.delta_limit IS 'Change of limit_tokens on every account of chain.';
COMMENT ON COLUMN fanout.ledger_entry.delta_reserved IS 'Change of reserved on every account of chain.';
COMMENT ON COLUMN fanout.ledger_entry.delta_spent IS 'Change of spent on every account of chain.';
COMMENT ON COLUMN fanout.ledger_entry.delta_held IS 'Change of held on every account of chain that holds (a run and its tenant).';
