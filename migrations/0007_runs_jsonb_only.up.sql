-- Runs readable in SQL (issue 11), step 2 of 2: contract.
--
-- Every row was converted to jsonb after 0006 (store/backfill.go); this
-- checks it, drops the proto-encoded bytea columns and names the jsonb ones
-- as they were: run.spec, run.result, task.outcome, run_event.event. Amounts
-- that auditors add up stay typed columns (task.tokens_spent, the ledger).

SET LOCAL search_path = fanout, pg_catalog;

DO $$
BEGIN
    IF EXISTS (SELECT FROM run WHERE spec_json IS NULL OR (result IS NOT NULL AND result_json IS NULL))
       OR EXISTS (SELECT FROM task WHERE outcome IS NOT NULL AND outcome_json IS NULL)
       OR EXISTS (SELECT FROM run_event WHERE event_json IS NULL) THEN
        RAISE EXCEPTION 'rows of run, task or run_event are not converted to jsonb'
            USING HINT = 'fanout migrate converts them after 0006, before it applies 0007; run it again';
    END IF;
END $$;

ALTER TABLE run DROP COLUMN spec, DROP COLUMN result;
ALTER TABLE run RENAME COLUMN spec_json TO spec;
ALTER TABLE run RENAME COLUMN result_json TO result;
ALTER TABLE run ALTER COLUMN spec SET NOT NULL,
    ADD CONSTRAINT run_spec_object CHECK (jsonb_typeof(spec) = 'object'),
    ADD CONSTRAINT run_result_object CHECK (jsonb_typeof(result) = 'object');
COMMENT ON COLUMN run.spec IS
    'The RunSpec as submitted, as protojson with the proto field names: spec->>''goal''.';
COMMENT ON COLUMN run.result IS
    'The JoinedResult as protojson; NULL while the run is RUNNING, or if it ended without one.';

ALTER TABLE task DROP COLUMN outcome;
ALTER TABLE task RENAME COLUMN outcome_json TO outcome;
ALTER TABLE task ADD CONSTRAINT task_outcome_object CHECK (jsonb_typeof(outcome) = 'object');
COMMENT ON COLUMN task.outcome IS
    'The TaskOutcome as protojson once the task has ended; started_at and finished_at are columns only.';

ALTER TABLE run_event DROP COLUMN event;
ALTER TABLE run_event RENAME COLUMN event_json TO event;
ALTER TABLE run_event ALTER COLUMN event SET NOT NULL,
    ADD CONSTRAINT run_event_event_object CHECK (jsonb_typeof(event) = 'object');
COMMENT ON COLUMN run_event.event IS
    'The RunEvent as protojson, without run_id, sequence and time (the columns hold them).';
