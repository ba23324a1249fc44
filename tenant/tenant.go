// Package tenant is who calls fanout and what each caller may do: tenants
// and their quotas, API keys and their scopes, the Principal a call acts
// as, the errors of managing them, and the interfaces of their store
// (store.Keys implements them). Like budget, it imports nothing but the
// standard library and budget, so that the orchestrator, the workers and
// the authenticator depend on it and never on a database driver.
package tenant

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fanout/fanout/budget"
)

// Errors of the key store. Validation errors are *AdminError values that
// unwrap to ErrAdminInvalid.
var (
	ErrTenantNotFound = errors.New("tenant not found")
	ErrTenantExists   = errors.New("tenant exists")
	ErrKeyNotFound    = errors.New("API key not found")
	ErrKeyExists      = errors.New("API key id exists")
	// ErrAdminInvalid: an argument was out of range; nothing was written.
	ErrAdminInvalid = errors.New("invalid admin argument")
	// ErrActorRefused: the actor may not act (a revoked or expired admin
	// key, or a role:NAME other than the session's role).
	ErrActorRefused = errors.New("actor refused")
)

// AdminError is a refusal of an admin function: the field it names and why
// (the database's message, which names the limit), unwrapping to Kind, one
// of the errors above.
type AdminError struct {
	Field   string
	Message string
	Kind    error
}

func (e *AdminError) Error() string { return e.Message }

// Unwrap returns the kind of refusal (ErrAdminInvalid, ErrTenantNotFound, ...).
func (e *AdminError) Unwrap() error { return e.Kind }

// Quotas are a tenant's caps; nil is no cap.
type Quotas struct {
	MaxRunTokens         *int64
	MaxConcurrentRuns    *int32
	MaxTasksInFlight     *int32
	KeyRequestsPerMinute *int32
	// Headroom is the share (0 < h <= 1) of a provider's stated rate limit
	// the tenant's runs plan to use when their concurrency is sized from it
	// (docs/operations.md#concurrency-from-the-rate-limits); nil: the
	// server's default. Not a cap: set with the quotas.
	Headroom *float64
}

// QuotaError is a request refused by one of a tenant's quotas: where
// each is enforced is in docs/architecture.md ("Tenant quotas").
type QuotaError struct {
	Tenant string
	Quota  string // the tenant column: max_concurrent_runs, ...
	Limit  int64
	Used   int64 // what the tenant holds now
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("tenant %s has %d of its %s %d in use", e.Tenant, e.Used, e.Quota, e.Limit)
}

// Tenant is a tenant's row.
type Tenant struct {
	ID string
	Quotas
	CreatedAt time.Time
	UpdatedAt time.Time
}

// APIKey is what may be shown of a key: never its secret nor its digest.
type APIKey struct {
	ID string
	// TenantID is "" for an admin key.
	TenantID          string
	Name              string
	Scopes            []string
	RequestsPerMinute *int32
	CreatedAt         time.Time
	CreatedBy         string
	ExpiresAt         *time.Time
	RevokedAt         *time.Time
	RevokedBy         string
}

// KeyRecord is a key as the authenticator needs it: its row with the
// digest of its secret, whether it is live as of the database's now(), and
// the request rate that applies to it.
type KeyRecord struct {
	APIKey
	SecretSHA256 []byte
	// Live: not revoked and not expired as of the database's now() when it
	// was read. The database's clock is the authority on expiry.
	Live bool
	// EffectiveRequestsPerMinute is the key's own rate, else its tenant's
	// key_requests_per_minute; 0 when neither caps it.
	EffectiveRequestsPerMinute int32
}

// KeyState is a key's state as the authenticator polls it.
type KeyState struct {
	ID string
	// Live: known, not revoked and not expired as of the database's now().
	Live bool
	// EffectiveRequestsPerMinute is as in KeyRecord.
	EffectiveRequestsPerMinute int32
}

// CreateKeyParams are the arguments of Directory.CreateKey.
type CreateKeyParams struct {
	Actor string
	KeyID string
	// TenantID is "" for an admin key (whose Scopes must be exactly admin).
	TenantID     string
	Name         string
	Scopes       []string
	SecretSHA256 []byte
	// RequestsPerMinute 0: the tenant's key_requests_per_minute applies.
	RequestsPerMinute int32
	// ExpiresAt zero: never.
	ExpiresAt time.Time
}

// UpdateTenantParams are the arguments of Directory.UpdateTenant: what is
// nil is left as it is.
type UpdateTenantParams struct {
	Actor    string
	TenantID string
	// Quotas, when set, replaces every quota (nil fields: no cap).
	Quotas *Quotas
	// Budget, when set, is the tenant's new budget (its TenantID and Actor
	// are UpdateTenantParams').
	Budget *budget.TenantBudget
}

// KeyEvents are the callbacks of KeyLookup.ListenKeyEvents; a nil one
// ignores its events.
type KeyEvents struct {
	// Revoked is called with the id of a key said to be revoked.
	Revoked func(keyID string)
	// QuotasChanged is called with a tenant whose quotas are said to have
	// changed.
	QuotasChanged func(tenantID string)
}

// KeyLookup is what authentication needs of the key store. An event is a
// hint (any database login may send one): read the states again.
type KeyLookup interface {
	// LookupKey returns key id's record, or ErrKeyNotFound.
	LookupKey(ctx context.Context, id string) (KeyRecord, error)
	// KeyStates returns the state of each of ids (an unknown id is not Live).
	KeyStates(ctx context.Context, ids []string) ([]KeyState, error)
	// LiveKeyIDs returns the ids of the live keys, at most limit of them.
	LiveKeyIDs(ctx context.Context, limit int) ([]string, error)
	// ListenKeyEvents hands key events to ev and calls ready each time it
	// listens again (what was sent meanwhile is gone) until ctx ends; it
	// returns an error at once if it cannot listen at all.
	ListenKeyEvents(ctx context.Context, ready func(), ev KeyEvents) error
	// DefineKeyRate creates or changes key id's request bucket (rpm > 0).
	DefineKeyRate(ctx context.Context, id string, rpm int32) error
	// TakeKeyRequest takes one request from key id's bucket: 0 when
	// granted, else how long until one would be.
	TakeKeyRequest(ctx context.Context, id string) (time.Duration, error)
}

// Directory is what AdminService needs: tenants and keys, each change
// logged under its actor in the same transaction.
type Directory interface {
	CreateTenant(ctx context.Context, actor, id string, q Quotas) (Tenant, error)
	UpdateTenant(ctx context.Context, p UpdateTenantParams) (Tenant, error)
	Tenant(ctx context.Context, id string) (Tenant, error)
	CreateKey(ctx context.Context, p CreateKeyParams) (APIKey, error)
	ListKeys(ctx context.Context, tenantID string) ([]APIKey, error)
	RevokeKey(ctx context.Context, actor, id string) (APIKey, error)
}
