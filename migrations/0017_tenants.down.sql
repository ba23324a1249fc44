-- Reverts 0017: no keys, no admin log, no quotas.

SET LOCAL search_path = fanout, pg_catalog;

DROP VIEW admin_audit;
DROP TABLE admin_action;
DROP FUNCTION admin_log(text, text, text, jsonb);
DROP FUNCTION admin_action_append_only();
DROP TABLE api_key;
ALTER TABLE tenant
    DROP COLUMN max_run_tokens,
    DROP COLUMN max_concurrent_runs,
    DROP COLUMN max_tasks_in_flight,
    DROP COLUMN key_requests_per_minute,
    DROP COLUMN updated_at;
