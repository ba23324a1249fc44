-- Reverts 0012: event appends carry no key.

SET LOCAL search_path = fanout, pg_catalog;

DROP INDEX run_event_key;
ALTER TABLE run_event DROP COLUMN event_key;
