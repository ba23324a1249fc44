-- Reverts 0011.

SET LOCAL search_path = fanout, pg_catalog;

ALTER TABLE run DROP COLUMN adoptions;
