-- Event appends are idempotent by key (issue 12): every event an
-- AppendEvents call writes carries a key the call made up before its first
-- try, unique per run, so that a retry after an ambiguous commit (the
-- connection lost at COMMIT) finds the events it wrote instead of writing
-- them again. Older rows, and the RunFinished that FinishRun writes with
-- the run's end (keyed by the run's state), have none.
--
-- Numbered 0012 while 0011 is written on another branch; it depends on
-- nothing newer than 0010 and may be renumbered when they merge.

SET LOCAL search_path = fanout, pg_catalog;

ALTER TABLE run_event ADD COLUMN event_key uuid;
CREATE UNIQUE INDEX run_event_key ON run_event (run_id, event_key);

COMMENT ON COLUMN run_event.event_key IS
    'key of the append that wrote the event (NULL for RunFinished and older rows): a retried append finds its events by it';
