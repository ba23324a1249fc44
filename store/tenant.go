package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store/internal/dbsqlc"
)

var _ budget.TenantLedger = (*Ledger)(nil)

// tenantAccountOf maps a row of the tenant_budget view
// (migrations/views/tenant_budget.sql) to the ledger's type.
func tenantAccountOf(r dbsqlc.TenantBudgetRow) budget.TenantAccount {
	t := budget.TenantAccount{
		Account: budget.Account{ID: budget.AccountID(r.AccountID), TenantID: r.TenantID, Kind: budget.KindTenant,
			Limit: r.LimitTokens, Reserved: r.ReservedTokens, Spent: r.SpentTokens,
			MinReservation: r.MinReservation, State: budget.AccountState(r.State), Held: r.HeldTokens},
		Period:      budget.Period{Kind: budget.PeriodKind(r.PeriodKind), Every: time.Duration(r.PeriodEverySeconds * float64(time.Second))},
		PeriodLimit: val(r.PeriodLimit), PeriodSpent: r.PeriodSpentTokens,
	}
	if r.PeriodEnd != nil {
		t.PeriodEnd = *r.PeriodEnd
	}
	return t
}

// setTenantBudgetParams are ledger_set_tenant_budget's arguments for b.
func setTenantBudgetParams(b budget.TenantBudget) dbsqlc.SetTenantBudgetParams {
	p := dbsqlc.SetTenantBudgetParams{Actor: b.Actor, TenantID: b.TenantID, LimitTokens: b.Limit, PeriodKind: string(b.Period.Kind)}
	if p.PeriodKind == "" {
		p.PeriodKind = string(budget.PeriodNone)
	}
	if b.Period.Kind == budget.PeriodEvery {
		p.PeriodEvery = &b.Period.Every
	}
	if b.MinReservation > 0 {
		p.MinReservation = &b.MinReservation
	}
	return p
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
	t, err := retry(ctx, l.log, "ledger.set_tenant_budget", unsentOnly, func(ctx context.Context, _ try) (budget.TenantAccount, error) {
		var t budget.TenantAccount
		err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
			if _, err := l.q.SetTenantBudget(ctx, tx, setTenantBudgetParams(b)); err != nil {
				return err
			}
			r, err := l.q.TenantBudget(ctx, tx, b.TenantID)
			t = tenantAccountOf(r)
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
		r, err := l.q.TenantBudget(ctx, l.pool, tenantID)
		if errors.Is(err, pgx.ErrNoRows) {
			return budget.TenantAccount{}, budget.ErrNotFound
		}
		return tenantAccountOf(r), err
	})
	if err != nil {
		return t, fmt.Errorf("read tenant %s account: %w", tenantID, err)
	}
	return t, nil
}
