-- Adopted runs are resumed, not ended (issue 12): the replica that adopts a
-- lost replica's run re-plans it from its stored spec and drives it on.
-- adoptions counts how many times the run changed hands that way; a run
-- adopted more than a few times (its orchestrators keep being lost: a
-- poison run, a crash loop) is ended FAILED instead of resumed again.

SET LOCAL search_path = fanout, pg_catalog;

ALTER TABLE run ADD COLUMN adoptions int NOT NULL DEFAULT 0 CHECK (adoptions >= 0);
