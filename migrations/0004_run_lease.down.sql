DROP INDEX IF EXISTS run_running_heartbeat;
ALTER TABLE run DROP COLUMN IF EXISTS owner_heartbeat;
