package store

import (
	"context"
	"errors"
	"fmt"
)

// ErrAuditRefused is what Audit.Grant and Audit.Revoke return (wrapped, with
// the database's reason naming the field) for a role or tenant they refuse:
// a malformed name, one of fanout's own roles or a role that already reads
// every tenant, an unknown tenant, or a revoke of a grant that does not
// exist. Nothing was changed.
var ErrAuditRefused = errors.New("audit grant refused")

// AuditGrantResult is what AuditGrant did.
type AuditGrantResult struct {
	Role, Tenant string
	// RoleCreated: the role did not exist and was created NOLOGIN; the
	// operator gives it LOGIN and a password, or grants it to a login role.
	RoleCreated bool
	// AlreadyGranted: the role already audited the tenant (nothing changed
	// but the log entry).
	AlreadyGranted bool
}

// Grant makes role an auditor of tenant: a member of
// fanout_tenant_auditor that reads, through every audit view, only the rows
// of the tenants it was granted (row-level security, migration 21). The
// role is created NOLOGIN if missing. The store's pool must connect as the
// owner (the role that runs migrations, which may create roles); the action
// is logged in admin_action as "role:<login>". Returns an error wrapping
// ErrAuditRefused for a role or tenant it refuses.
func (s *Audit) Grant(ctx context.Context, tenant, role string) (AuditGrantResult, error) {
	res, err := retry(ctx, s.log, "audit.grant", unsentOnly, func(ctx context.Context, _ try) (AuditGrantResult, error) {
		res := AuditGrantResult{Role: role, Tenant: tenant}
		err := s.pool.QueryRow(ctx, `SELECT role_created, already_granted
			FROM fanout.audit_grant('role:' || session_user, $1, $2)`, tenant, role).Scan(&res.RoleCreated, &res.AlreadyGranted)
		return res, err
	})
	if err != nil {
		return res, fmt.Errorf("audit grant of tenant %s to role %s: %w", tenant, role, auditError(err))
	}
	return res, nil
}

// Revoke ends role's reading of tenant. A role left auditing no tenant
// loses fanout_tenant_auditor and its USAGE on the schema; the role itself
// is kept (DROP ROLE is the operator's). It returns how many tenants the
// role still audits. The store's pool must connect as the owner. Returns
// an error wrapping ErrAuditRefused if the role did not audit the tenant.
func (s *Audit) Revoke(ctx context.Context, tenant, role string) (int, error) {
	left, err := retry(ctx, s.log, "audit.revoke", unsentOnly, func(ctx context.Context, _ try) (int, error) {
		var left int
		err := s.pool.QueryRow(ctx, `SELECT tenants_left
			FROM fanout.audit_revoke('role:' || session_user, $1, $2)`, tenant, role).Scan(&left)
		return left, err
	})
	if err != nil {
		return 0, fmt.Errorf("audit revoke of tenant %s from role %s: %w", tenant, role, auditError(err))
	}
	return left, nil
}

// auditError turns the functions' refusals (invalid_parameter_value) into
// ErrAuditRefused with their reason, and says what a role without the
// owner's rights lacks.
func auditError(err error) error {
	switch {
	case isCode(err, "22023"):
		return fmt.Errorf("%w: %s", ErrAuditRefused, pgMessage(err))
	case isCode(err, "42501"): // insufficient_privilege
		return fmt.Errorf("%s: connect as the owner role (the one that runs fanout migrate): %w", pgMessage(err), err)
	}
	return err
}
