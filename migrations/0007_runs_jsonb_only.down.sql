-- Reverts 0007: the bytea columns come back empty beside the jsonb ones
-- (renamed *_json again); the migrator refills them before it reverts 0006.

SET LOCAL search_path = fanout, pg_catalog;

ALTER TABLE run_event DROP CONSTRAINT run_event_event_object, ALTER COLUMN event DROP NOT NULL;
COMMENT ON COLUMN run_event.event IS NULL;
ALTER TABLE run_event RENAME COLUMN event TO event_json;
ALTER TABLE run_event ADD COLUMN event bytea;

ALTER TABLE task DROP CONSTRAINT task_outcome_object;
COMMENT ON COLUMN task.outcome IS NULL;
ALTER TABLE task RENAME COLUMN outcome TO outcome_json;
ALTER TABLE task ADD COLUMN outcome bytea;

ALTER TABLE run DROP CONSTRAINT run_spec_object, DROP CONSTRAINT run_result_object,
    ALTER COLUMN spec DROP NOT NULL;
COMMENT ON COLUMN run.spec IS NULL;
COMMENT ON COLUMN run.result IS NULL;
ALTER TABLE run RENAME COLUMN spec TO spec_json;
ALTER TABLE run RENAME COLUMN result TO result_json;
ALTER TABLE run ADD COLUMN spec bytea, ADD COLUMN result bytea;
