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

// Period is a tenant budget's period. The zero Period is PeriodNone.
type Period struct {
	Kind  PeriodKind    // "" is PeriodNone
	Every time.Duration // PeriodEvery only: the length, >= 1s
}

// TenantBudget sets a tenant's token budget: Limit tokens per Period
// (PeriodNone: Limit in all). Actor names who set it, for the admin log
// ("key:fk_..." or "role:NAME").
//
// A changed Period starts a new period at once, from what the tenant has
// spent by then; a changed Limit applies to the current period. A Limit
// below what the period already spent and holds leaves nothing to grant
// until the next period (the account's limit is clamped to reserved +
// spent), and exhausts the tenant's runs.
type TenantBudget struct {
	TenantID string
	Limit    int64
	Period   Period
	Actor    string
	// MinReservation: the tenant is exhausted (every open run under it
	// ends BUDGET_EXHAUSTED) when its available tokens fall below it. 0
	// keeps the current value (1 for a new account).
	MinReservation int64
}

// MaxTenantIDLen bounds a tenant id (the tenant table's CHECK).
const MaxTenantIDLen = 128

// Validate checks b before anything is written.
func (b TenantBudget) Validate() error {
	switch {
	case b.TenantID == "" || len(b.TenantID) > MaxTenantIDLen:
		return invalid("tenant_id", "must be 1..%d bytes, got %d", MaxTenantIDLen, len(b.TenantID))
	case b.Actor == "":
		return invalid("actor", "must name who sets the budget, for the admin log")
	case b.Limit <= 0:
		return invalid("limit", "must be > 0, got %d", b.Limit)
	case b.MinReservation < 0 || b.MinReservation > b.Limit:
		return invalid("min_reservation", "must be in 0..limit (%d), got %d (0 keeps the current one)", b.Limit, b.MinReservation)
	}
	switch b.Period.Kind {
	case "", PeriodNone, PeriodDay, PeriodMonth:
		if b.Period.Every != 0 {
			return invalid("period.every", "only with period %q, got %s with period %q", PeriodEvery, b.Period.Every, b.Period.Kind)
		}
	case PeriodEvery:
		if b.Period.Every < time.Second {
			return invalid("period.every", "must be >= 1s, got %s", b.Period.Every)
		}
	default:
		return invalid("period.kind", "must be one of none, day, month, every; got %q", b.Period.Kind)
	}
	return nil
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

// Exhausted reports whether the tenant can grant no run its minimum: its
// available tokens are below its MinReservation.
func (t TenantAccount) Exhausted() bool { return t.Available() < t.MinReservation }

// TenantLedger is the ledger's tenant side. store.Ledger implements it.
type TenantLedger interface {
	// SetTenantBudget opens the tenant's account (creating the tenant if
	// needed) or changes its budget, and logs the change in the admin log.
	// Returns a *ValidationError (nothing written) on a bad budget.
	SetTenantBudget(ctx context.Context, b TenantBudget) (TenantAccount, error)
	// TenantAccount returns the tenant's account as of now: when the
	// period's end has passed, as the next statement will roll it over
	// (nothing is written). ErrNotFound when the tenant has no budget.
	TenantAccount(ctx context.Context, tenantID string) (TenantAccount, error)
}
