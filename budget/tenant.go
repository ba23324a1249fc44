package budget

import (
	"context"
	"time"
)

// PeriodKind is how often a tenant's budget starts again.
type PeriodKind string

// The periods of a tenant budget. Day and month periods start at midnight
// UTC (and on the 1st) in database time; PeriodEvery is a rolling period of
// a fixed length (tests use short ones).
const (
	PeriodNone  PeriodKind = "none"
	PeriodDay   PeriodKind = "day"
	PeriodMonth PeriodKind = "month"
	PeriodEvery PeriodKind = "every"
)

// Period is a tenant budget's period.
type Period struct {
	Kind  PeriodKind
	Every time.Duration // PeriodEvery only: the length, >= 1s
}

// TenantBudget sets a tenant's token budget: Limit tokens per Period
// (PeriodNone: Limit in all). Actor names who set it, for the admin log.
type TenantBudget struct {
	TenantID string
	Limit    int64
	Period   Period
	Actor    string
}

// TenantAccount is a tenant's account and its period.
type TenantAccount struct {
	Account
	Period      Period
	PeriodLimit int64
	// PeriodEnd is when the current period ends (database time); zero for
	// PeriodNone.
	PeriodEnd time.Time
	// PeriodSpent is what the tenant spent in the current period.
	PeriodSpent int64
}

// TenantLedger is the ledger's tenant side. store.Ledger implements it.
type TenantLedger interface {
	// SetTenantBudget opens the tenant's account (creating the tenant if
	// needed) or changes its budget, and logs the change in the admin log.
	SetTenantBudget(ctx context.Context, b TenantBudget) (TenantAccount, error)
	// TenantAccount returns the tenant's account. ErrNotFound when the
	// tenant has no budget.
	TenantAccount(ctx context.Context, tenantID string) (TenantAccount, error)
}
