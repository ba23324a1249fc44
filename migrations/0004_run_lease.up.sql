-- Run leases: the orchestrator driving a run (run.owner) refreshes
-- owner_heartbeat every few seconds, in database time. A RUNNING run whose
-- heartbeat is older than the fleet's orphan threshold has lost its
-- orchestrator (crash, kill -9, node loss); any live replica adopts it with
-- one conditional UPDATE that takes ownership, then ends it.
--
-- Runs that exist when this migrates get the migration's time: if their
-- owner does not heartbeat them (an older binary, or none), they are adopted
-- once the threshold passes.

ALTER TABLE run ADD COLUMN owner_heartbeat timestamptz NOT NULL DEFAULT now();

-- The orphan scan reads RUNNING runs by heartbeat, stalest first.
CREATE INDEX run_running_heartbeat ON run (owner_heartbeat) WHERE state = 'RUNNING';
