package store

import (
	"context"
	"errors"

	"github.com/fanout/fanout/budget"
)

var _ budget.TenantLedger = (*Ledger)(nil)

// SetTenantBudget implements budget.TenantLedger.
func (l *Ledger) SetTenantBudget(ctx context.Context, b budget.TenantBudget) (budget.TenantAccount, error) {
	return budget.TenantAccount{}, errors.New("SetTenantBudget: not built yet")
}

// TenantAccount implements budget.TenantLedger.
func (l *Ledger) TenantAccount(ctx context.Context, tenantID string) (budget.TenantAccount, error) {
	return budget.TenantAccount{}, budget.ErrNotFound
}
