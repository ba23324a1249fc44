-- 0026: a run that asks for synthesis holds its allowance back in the
-- ledger (issue 25; DESIGN §9, I19). account.held is what a run keeps for
-- its synthesis, and a tenant account holds the sum of its runs': held
-- counts against the limit like reserved (the CHECK), is not available to
-- any subagent (a run is exhausted at limit - reserved - spent - held <
-- min_reservation), and only a reserve that draws on it (the synthesis's)
-- turns it into a reservation. A run that ends gives back what is still
-- held. Entries carry the change (delta_held, kinds 'hold' and 'release'),
-- so conservation covers it: held = the sum of delta_held over the chain.
-- Task accounts hold nothing.
ALTER TABLE fanout.account ADD COLUMN held bigint NOT NULL DEFAULT 0;
ALTER TABLE fanout.account ADD CONSTRAINT account_held_check CHECK (held >= 0 AND (held = 0 OR kind <> 'task'));
ALTER TABLE fanout.account DROP CONSTRAINT account_within_limit;
ALTER TABLE fanout.account ADD CONSTRAINT account_within_limit
    CHECK (reserved >= 0 AND spent >= 0 AND reserved + spent + held <= limit_tokens);
COMMENT ON COLUMN fanout.account.held IS
    'Tokens held back for the run''s synthesis (a tenant account: the sum of its runs''); counted against limit_tokens, available to no subagent.';

ALTER TABLE fanout.ledger_entry ADD COLUMN delta_held bigint NOT NULL DEFAULT 0;
ALTER TABLE fanout.ledger_entry DROP CONSTRAINT ledger_entry_kind_check;
ALTER TABLE fanout.ledger_entry ADD CONSTRAINT ledger_entry_kind_check
    CHECK (kind IN ('open', 'reserve', 'settle', 'void', 'expire', 'exhaust', 'cancel', 'close', 'period', 'adjust',
                    'hold', 'release'));

GRANT SELECT (held) ON fanout.account TO fanout_auditor, fanout_tenant_auditor;
GRANT SELECT (delta_held) ON fanout.ledger_entry TO fanout_auditor, fanout_tenant_auditor, fanout_worker;

-- A reservation the synthesis drew on what its run holds: what it does not
-- spend goes back to held (ledger_rehold), so that a retried or further
-- synthesis call still finds it.
ALTER TABLE fanout.reservation ADD COLUMN from_held boolean NOT NULL DEFAULT false;
