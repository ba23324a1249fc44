package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
)

var _ budget.TenantLedger = (*Ledger)(nil)

// tenantCols are the columns of the tenant_budget view (migrations/views/tenant_budget.sql),
// in the order scanTenantAccount reads them.
const tenantCols = `account_id, tenant_id, limit_tokens, reserved_tokens, spent_tokens, min_reservation, state,
	period_kind, coalesce(extract(epoch FROM period_every), 0)::float8, period_limit, period_end, period_spent_tokens`

func scanTenantAccount(row pgx.Row) (budget.TenantAccount, error) {
	var t budget.TenantAccount
	var every float64
	var end *time.Time
	err := row.Scan(&t.ID, &t.TenantID, &t.Limit, &t.Reserved, &t.Spent, &t.MinReservation, &t.State,
		&t.Period.Kind, &every, &t.PeriodLimit, &end, &t.PeriodSpent)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, budget.ErrNotFound
	}
	t.Kind = budget.KindTenant
	t.Period.Every = time.Duration(every * float64(time.Second))
	if end != nil {
		t.PeriodEnd = *end
	}
	return t, err
}

// SetTenantBudget implements budget.TenantLedger: one call of
// ledger_set_tenant_budget, which changes the account under its lock,
// posts the change of limit as an entry and appends the action to
// admin_action in the same transaction. It is retried only when the try
// surely did not commit (it logs an action each time it runs).
func (l *Ledger) SetTenantBudget(ctx context.Context, b budget.TenantBudget) (budget.TenantAccount, error) {
	if err := b.Validate(); err != nil {
		return budget.TenantAccount{}, err
	}
	kind := b.Period.Kind
	if kind == "" {
		kind = budget.PeriodNone
	}
	var every *time.Duration
	if b.Period.Kind == budget.PeriodEvery {
		every = &b.Period.Every
	}
	var minRes *int64
	if b.MinReservation > 0 {
		minRes = &b.MinReservation
	}
	t, err := retry(ctx, l.log, "ledger.set_tenant_budget", unsentOnly, func(ctx context.Context, _ try) (budget.TenantAccount, error) {
		var t budget.TenantAccount
		err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
			var id int64
			if err := tx.QueryRow(ctx, "SELECT account_id FROM ledger_set_tenant_budget($1, $2, $3, $4, $5, $6)",
				b.Actor, b.TenantID, b.Limit, string(kind), every, minRes).Scan(&id); err != nil {
				return err
			}
			var err error
			t, err = scanTenantAccount(tx.QueryRow(ctx, "SELECT "+tenantCols+" FROM tenant_budget WHERE account_id = $1", id))
			return err
		})
		return t, err
	})
	if isCode(err, "22023") { // invalid_parameter_value: Validate should have caught it
		err = &budget.ValidationError{Field: "budget", Reason: pgMessage(err)}
	}
	if err != nil {
		return t, fmt.Errorf("set budget of tenant %s: %w", b.TenantID, err)
	}
	return t, nil
}

// TenantAccount implements budget.TenantLedger. It reads the tenant_budget
// view, which reports a period whose end has passed as rolled over.
func (l *Ledger) TenantAccount(ctx context.Context, tenantID string) (budget.TenantAccount, error) {
	t, err := retry(ctx, l.log, "ledger.tenant_account", idempotent, func(ctx context.Context, _ try) (budget.TenantAccount, error) {
		return scanTenantAccount(l.pool.QueryRow(ctx, "SELECT "+tenantCols+" FROM tenant_budget WHERE tenant_id = $1", tenantID))
	})
	if err != nil {
		return t, fmt.Errorf("read tenant %s account: %w", tenantID, err)
	}
	return t, nil
}
