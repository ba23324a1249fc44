-- audit_ledger_entry shows the split too.
CREATE VIEW audit_ledger_entry AS
SELECT entry_id, tenant_id, run_id, task_id, account_id, reservation_id, kind, delta_limit,
       delta_reserved, delta_spent, actual, overrun, estimated, holder, note, created_at,
       model, input_tokens, output_tokens, delta_held
  FROM ledger_entry;
GRANT SELECT ON audit_ledger_entry TO fanout_app, fanout_auditor;
