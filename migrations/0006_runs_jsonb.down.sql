-- Reverts 0006. Before this runs, the migrator refills the bytea columns
-- from the jsonb ones (store/backfill.go; rows written at version 7 have
-- only jsonb); a row it did not refill stops the migration here rather than
-- losing its data.

DO $$
BEGIN
    IF EXISTS (SELECT FROM run WHERE (spec IS NULL AND spec_json IS NOT NULL)
                                  OR (result IS NULL AND result_json IS NOT NULL))
       OR EXISTS (SELECT FROM task WHERE outcome IS NULL AND outcome_json IS NOT NULL)
       OR EXISTS (SELECT FROM run_event WHERE event IS NULL AND event_json IS NOT NULL) THEN
        RAISE EXCEPTION 'rows of run, task or run_event hold only jsonb'
            USING HINT = 'fanout migrate converts them back to bytea before it reverts 0006; run it again';
    END IF;
END $$;

ALTER TABLE run ALTER COLUMN spec SET NOT NULL, DROP COLUMN spec_json, DROP COLUMN result_json;
ALTER TABLE task DROP COLUMN outcome_json;
ALTER TABLE run_event ALTER COLUMN event SET NOT NULL, DROP COLUMN event_json;
