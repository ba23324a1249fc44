-- Reverts 0020: the admin functions.

SET LOCAL search_path = fanout, pg_catalog;

DROP FUNCTION admin_revoke_key(text, text);
DROP FUNCTION admin_create_key(text, text, text, text, text[], bytea, int, timestamptz);
DROP FUNCTION admin_set_quotas(text, text, bigint, int, int, int);
DROP FUNCTION admin_create_tenant(text, text, bigint, int, int, int);
DROP FUNCTION admin_check_quotas(bigint, int, int, int);
DROP FUNCTION admin_check_tenant_id(text);
DROP FUNCTION admin_check_actor(text);
