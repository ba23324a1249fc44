-- Reverts 0016: nodes insert tool_call rows directly again, unfenced.

SET LOCAL search_path = fanout, pg_catalog;

DROP FUNCTION tool_call_issue(bigint, text, text, text, text, bigint, int, int, text, text, text);
GRANT INSERT (key, tenant_id, run_id, task_id, attempt, iteration, call_index, server, tool, args_digest)
    ON tool_call TO fanout_app;
