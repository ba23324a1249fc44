-- Reverts 0015: the record of tool writes is dropped with it.

SET LOCAL search_path = fanout, pg_catalog;

DROP VIEW tool_calls;
DROP TABLE tool_call;
DROP FUNCTION tool_call_resolve_once();
