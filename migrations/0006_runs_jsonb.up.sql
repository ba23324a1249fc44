-- Runs readable in SQL (issue 11), step 1 of 2: expand.
--
-- Specs, task outcomes, joined results and events were kept proto-encoded
-- in bytea, which SQL cannot read. This adds a jsonb column beside each.
-- Right after applying it, `fanout migrate` fills them from the bytea
-- columns in Go (store/backfill.go: protojson with the proto field names,
-- 500 rows per transaction by primary key, idempotent), and resumes that on
-- its next run if it was cut off; 0007 then checks that every row was
-- converted, drops the bytea columns and gives the jsonb ones their names.
--
-- Until 0007 the bytea columns stay the truth: a binary of migration 5
-- still works here.

ALTER TABLE run ADD COLUMN spec_json jsonb, ADD COLUMN result_json jsonb;
ALTER TABLE task ADD COLUMN outcome_json jsonb;
ALTER TABLE run_event ADD COLUMN event_json jsonb;
