-- 0024: a worker acts only on the tasks dispatched to it (issue 23, from
-- its review). A worker's login could read an account's attempt number and
-- a reservation's generation, and with them reserve, settle, void or renew
-- on any tenant's task, and read or resolve any task's tool calls. Each
-- attempt now has a secret: ledger_begin_attempt makes a random one, keeps
-- only its SHA-256 (account.secret_hash) and returns it to the
-- orchestrator, which sends it to the worker inside the signed dispatch.
-- The reservations and tool calls made under an attempt keep its hash, and
-- every function a worker calls on them asks for the secret
-- (migrations/functions/ledger_secret_ok.sql). An orchestrator's login
-- begins attempts, so it could mint a secret anyway: it is not asked.
--
-- Upgrading: reservations and tool calls made before have no hash; a worker
-- cannot settle them (their leases expire and are posted in full, as for a
-- worker that died), an orchestrator can. Drain workers before upgrading.
ALTER TABLE fanout.account ADD COLUMN secret_hash bytea;
ALTER TABLE fanout.reservation ADD COLUMN secret_hash bytea;
ALTER TABLE fanout.tool_call ADD COLUMN secret_hash bytea;
COMMENT ON COLUMN fanout.account.secret_hash IS 'SHA-256 of the current attempt''s secret (ledger_begin_attempt); NULL before the first attempt.';
COMMENT ON COLUMN fanout.reservation.secret_hash IS 'SHA-256 of the secret of the attempt the reservation was granted to.';
COMMENT ON COLUMN fanout.tool_call.secret_hash IS 'SHA-256 of the secret of the attempt that issued the call.';

-- A worker reads and resolves tool calls through tool_call_writes and
-- tool_call_resolve, which ask for the attempt's secret; of the table it
-- reads only what says which call it is and where it stands (no result, no
-- error text: those are the tenant's data).
REVOKE SELECT, UPDATE ON TABLE fanout.tool_call FROM fanout_worker;
REVOKE UPDATE ON TABLE fanout.tool_call FROM fanout_app;
GRANT SELECT (key, tenant_id, run_id, task_id, attempt, iteration, call_index, server, tool, args_digest,
              state, created_at, resolved_at) ON TABLE fanout.tool_call TO fanout_worker;

-- A worker reads of the semaphore's slots how many of each key are taken
-- (its gauge and its waits), not whose leases they are.
REVOKE SELECT ON TABLE fanout.semaphore_slot FROM fanout_worker;
GRANT SELECT (key, slot, expires_at) ON TABLE fanout.semaphore_slot TO fanout_worker;

-- Request buckets of API keys ("key:<id>") are the orchestrators' and
-- AdminService's: a worker defines and debits its providers' buckets only,
-- so it can neither drain a key's requests nor lift a tenant's rate.
ALTER TABLE fanout.rate_bucket ENABLE ROW LEVEL SECURITY;
CREATE POLICY rate_bucket_any ON fanout.rate_bucket FOR ALL TO fanout_app, fanout_admin
    USING (true) WITH CHECK (true);
CREATE POLICY rate_bucket_provider ON fanout.rate_bucket FOR ALL TO fanout_worker
    USING (bucket NOT LIKE 'key:%') WITH CHECK (bucket NOT LIKE 'key:%');
