-- Reverts 0013.

SET LOCAL search_path = fanout, pg_catalog;

DROP FUNCTION ledger_end_run_fenced(text, text, text, bigint);
