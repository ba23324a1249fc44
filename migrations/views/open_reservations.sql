CREATE VIEW open_reservations AS
SELECT r.tenant_id, r.run_id, a.task_id, r.reservation_id, r.amount AS reserved_tokens,
       r.holder, r.generation, r.created_at, r.lease_expires_at,
       r.lease_expires_at <= now() AS lease_expired, now() - r.created_at AS age
  FROM reservation r JOIN account a USING (account_id)
 WHERE r.state = 'held';
GRANT SELECT ON open_reservations TO fanout_app, fanout_auditor;
