DROP VIEW IF EXISTS audit_ledger_entry, conservation_check, open_reservations,
    tenant_spend_daily, task_spend, run_spend;
DROP FUNCTION IF EXISTS ledger_end_run(text, text, text), ledger_expire(bigint),
    ledger_renew(bigint, bigint, interval), ledger_void(bigint, bigint, text),
    ledger_settle(bigint, bigint, bigint, boolean),
    ledger_reserve(bigint, bigint, bigint, text, interval, text),
    ledger_lock_chain(bigint[]), ledger_check_exhausted(bigint[]),
    ledger_result_of(text, reservation);
DROP TYPE IF EXISTS ledger_result;
DROP TABLE IF EXISTS ledger_entry, reservation, account, tenant;
DROP FUNCTION IF EXISTS ledger_entry_append_only();
-- Roles are cluster-wide and may serve other databases: they are left in place.
