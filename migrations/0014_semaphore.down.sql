-- Reverts 0014: the semaphores' slots are gone (holders lose nothing they
-- could keep: a node of an older version has no semaphore).

SET LOCAL search_path = fanout, pg_catalog;

DROP FUNCTION semaphore_release(bigint, text, interval);
DROP FUNCTION semaphore_renew(bigint, text, interval);
DROP FUNCTION semaphore_acquire(bigint, text, text[], int[], interval);
DROP TABLE semaphore_slot;
