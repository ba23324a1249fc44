package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store/internal/dbsqlc"
	"github.com/fanout/fanout/tenant"
)

// Keys is the store of tenants and API keys. Every change goes through the
// admin functions (migrations/functions/admin_*.sql), which log it in admin_action in the
// same transaction; reads are plain SELECTs (fanout_app may read api_key
// and tenant). Its statements are the named queries of queries/keys.sql and
// queries/tenants.sql.
type Keys struct {
	db
	notifier *Notifier
	rate     *RateLimiter
	// actorSecret is the secret the acting key's caller presented
	// (WithActorSecret); "" for an actor that needs none.
	actorSecret string
}

var _ tenant.Directory = (*Keys)(nil)

// NewKeys returns the key store on pool, hearing key events from n (nil
// when ListenKeyEvents is not called).
func NewKeys(pool *Pool, n *Notifier) *Keys {
	return &Keys{db: newDB(pool, nil), notifier: n, rate: NewRateLimiter(pool)}
}

// WithActorSecret returns k acting for an API key whose caller presented
// secret: each of its changes hands the secret to the database in its own
// transaction (presentActorSecret), which checks it against the key's
// digest before it logs the key as the actor. AdminService acts through it
// for an admin key; without it a key actor is refused (ErrActorRefused).
func (k *Keys) WithActorSecret(secret string) tenant.Directory {
	c := *k
	c.actorSecret = secret
	return &c
}

// presentActorSecret hands secret (the acting key's, as its caller sent
// it) to the database for tx alone: the admin functions and
// tool_call_decide check it against the key's digest (actor_key_proven)
// before they name the key. It travels as a bind parameter, never in a
// statement's text, which spans and pg_stat_activity show; a database that
// logs statements with their parameters logs it (docs/auditing.md). Nothing
// for "".
func presentActorSecret(ctx context.Context, q *dbsqlc.Queries, tx pgx.Tx, secret string) error {
	if secret == "" {
		return nil
	}
	if err := q.PresentActorSecret(ctx, tx, secret); err != nil {
		return fmt.Errorf("present the actor's secret: %w", err)
	}
	return nil
}

// change runs one admin change, f, in a transaction that first presents
// k's actor secret.
func (k *Keys) change(ctx context.Context, f func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, k.pool, func(tx pgx.Tx) error {
		if err := presentActorSecret(ctx, k.q, tx, k.actorSecret); err != nil {
			return err
		}
		return f(tx)
	})
}

// adminError translates a refusal of an admin function: the functions
// raise "field: reason" with SQLSTATE 22023 (invalid), 42501 (actor
// refused), P0002 (not found) or 23505 (exists).
func adminError(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	field, _, _ := strings.Cut(pgErr.Message, ":")
	e := &tenant.AdminError{Field: field, Message: pgErr.Message}
	switch pgErr.Code {
	case "22023":
		e.Kind = tenant.ErrAdminInvalid
	case "42501":
		e.Kind = tenant.ErrActorRefused
	case "P0002":
		e.Kind = tenant.ErrTenantNotFound
		if field == "key_id" {
			e.Kind = tenant.ErrKeyNotFound
		}
	case "23505":
		e.Kind = tenant.ErrTenantExists
		if pgErr.ConstraintName == "api_key_pkey" {
			e.Kind, e.Field, e.Message = tenant.ErrKeyExists, "key_id", "key_id: a key with this id exists"
		}
	default:
		return err
	}
	return e
}

func optInt32(v int32) *int32 {
	if v == 0 {
		return nil
	}
	return &v
}

// tenantOf maps a tenant row to the tenant package's type.
func tenantOf(r dbsqlc.Tenant) tenant.Tenant {
	return tenant.Tenant{ID: r.TenantID, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, Quotas: tenant.Quotas{
		MaxRunTokens: r.MaxRunTokens, MaxConcurrentRuns: r.MaxConcurrentRuns,
		MaxTasksInFlight: r.MaxTasksInFlight, KeyRequestsPerMinute: r.KeyRequestsPerMinute, Headroom: r.Headroom}}
}

// CreateTenant creates tenant id with quotas q, logged as actor. A tenant
// that exists is ErrTenantExists (creates are not idempotent: change an
// existing tenant's quotas with SetQuotas); bad arguments are
// tenant.ErrAdminInvalid naming the field.
func (k *Keys) CreateTenant(ctx context.Context, actor, id string, q tenant.Quotas) (tenant.Tenant, error) {
	t, err := retry(ctx, k.log, "admin.create_tenant", unsentOnly, func(ctx context.Context, _ try) (tenant.Tenant, error) {
		var r dbsqlc.Tenant
		err := k.change(ctx, func(tx pgx.Tx) (err error) {
			r, err = k.q.CreateTenant(ctx, tx, dbsqlc.CreateTenantParams{Actor: actor, TenantID: id,
				MaxRunTokens: q.MaxRunTokens, MaxConcurrentRuns: q.MaxConcurrentRuns,
				MaxTasksInFlight: q.MaxTasksInFlight, KeyRequestsPerMinute: q.KeyRequestsPerMinute, Headroom: q.Headroom})
			return err
		})
		return tenantOf(r), err
	})
	if err != nil {
		return tenant.Tenant{}, fmt.Errorf("create tenant %s: %w", id, adminError(err))
	}
	return t, nil
}

// SetQuotas sets every quota of tenant id to q (nil: no cap), logged as
// actor. An unknown tenant is tenant.ErrTenantNotFound.
func (k *Keys) SetQuotas(ctx context.Context, actor, id string, q tenant.Quotas) (tenant.Tenant, error) {
	t, err := retry(ctx, k.log, "admin.set_quotas", unsentOnly, func(ctx context.Context, _ try) (tenant.Tenant, error) {
		var r dbsqlc.Tenant
		err := k.change(ctx, func(tx pgx.Tx) (err error) {
			r, err = k.q.SetQuotas(ctx, tx, setQuotasParams(actor, id, q))
			return err
		})
		return tenantOf(r), err
	})
	if err != nil {
		return tenant.Tenant{}, fmt.Errorf("set quotas of tenant %s: %w", id, adminError(err))
	}
	return t, nil
}

// UpdateTenant sets a tenant's quotas and its budget in one transaction,
// each logged as p.Actor: both change or neither does. Bad arguments are
// tenant.ErrAdminInvalid naming the field (quotas) or a *budget.ValidationError
// (budget); an unknown tenant is tenant.ErrTenantNotFound.
func (k *Keys) UpdateTenant(ctx context.Context, p tenant.UpdateTenantParams) (tenant.Tenant, error) {
	var b budget.TenantBudget
	if p.Budget != nil {
		b = *p.Budget
		b.TenantID, b.Actor = p.TenantID, p.Actor
		if b.Period.Kind == "" {
			b.Period.Kind = budget.PeriodNone
		}
		if err := b.Validate(); err != nil { // before anything is written
			return tenant.Tenant{}, fmt.Errorf("update tenant %s: %w", p.TenantID, err)
		}
	}
	t, err := retry(ctx, k.log, "admin.update_tenant", unsentOnly, func(ctx context.Context, _ try) (tenant.Tenant, error) {
		var t tenant.Tenant
		err := k.change(ctx, func(tx pgx.Tx) error {
			// The tenant's row first: a missing tenant is refused before the
			// budget function would create it (tenants are never deleted).
			r, err := k.q.Tenant(ctx, tx, p.TenantID)
			if errors.Is(err, pgx.ErrNoRows) {
				return tenant.ErrTenantNotFound
			}
			if err != nil {
				return err
			}
			if q := p.Quotas; q != nil {
				if r, err = k.q.SetQuotas(ctx, tx, setQuotasParams(p.Actor, p.TenantID, *q)); err != nil {
					return adminError(err)
				}
			}
			t = tenantOf(r)
			if p.Budget != nil {
				if _, err := k.q.SetTenantBudget(ctx, tx, setTenantBudgetParams(b)); err != nil {
					if isCode(err, "22023") {
						return &budget.ValidationError{Field: "budget", Reason: pgMessage(err)}
					}
					return err
				}
			}
			return nil
		})
		return t, err
	})
	if err != nil {
		return tenant.Tenant{}, fmt.Errorf("update tenant %s: %w", p.TenantID, err)
	}
	return t, nil
}

// Tenant returns tenant id's row. An unknown tenant is tenant.ErrTenantNotFound.
func (k *Keys) Tenant(ctx context.Context, id string) (tenant.Tenant, error) {
	t, err := retry(ctx, k.log, "keys.tenant", idempotent, func(ctx context.Context, _ try) (tenant.Tenant, error) {
		r, err := k.q.Tenant(ctx, k.pool, id)
		return tenantOf(r), err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return tenant.Tenant{}, fmt.Errorf("tenant %s: %w", id, tenant.ErrTenantNotFound)
	}
	if err != nil {
		return tenant.Tenant{}, fmt.Errorf("read tenant %s: %w", id, err)
	}
	return t, nil
}

// CreateKey stores a key (its secret only as the digest p.SecretSHA256),
// logged as p.Actor, and returns it as ListKeys shows it. Bad arguments are
// tenant.ErrAdminInvalid naming the field; an unknown tenant tenant.ErrTenantNotFound; a
// key id in use tenant.ErrKeyExists.
func (k *Keys) CreateKey(ctx context.Context, p tenant.CreateKeyParams) (tenant.APIKey, error) {
	var tenantID *string
	if p.TenantID != "" {
		tenantID = &p.TenantID
	}
	var expires *time.Time
	if !p.ExpiresAt.IsZero() {
		expires = &p.ExpiresAt
	}
	created, err := retry(ctx, k.log, "admin.create_key", unsentOnly, func(ctx context.Context, _ try) (time.Time, error) {
		var created time.Time
		err := k.change(ctx, func(tx pgx.Tx) (err error) {
			created, err = k.q.CreateKey(ctx, tx, dbsqlc.CreateKeyParams{Actor: p.Actor, KeyID: p.KeyID, TenantID: tenantID,
				Name: p.Name, Scopes: p.Scopes, SecretSha256: p.SecretSHA256,
				RequestsPerMinute: optInt32(p.RequestsPerMinute), ExpiresAt: expires})
			return err
		})
		return created, err
	})
	if err != nil {
		// The digest is an argument: it is never part of the error.
		return tenant.APIKey{}, fmt.Errorf("create key %s: %w", p.KeyID, adminError(err))
	}
	return tenant.APIKey{
		ID: p.KeyID, TenantID: p.TenantID, Name: p.Name, Scopes: p.Scopes,
		RequestsPerMinute: optInt32(p.RequestsPerMinute), CreatedAt: created, CreatedBy: p.Actor, ExpiresAt: expires,
	}, nil
}

// keyOf maps a key row to what may be shown of a key.
func keyOf(r dbsqlc.ListKeysRow) tenant.APIKey {
	return tenant.APIKey{ID: r.KeyID, TenantID: r.TenantID, Name: r.Name, Scopes: r.Scopes,
		RequestsPerMinute: r.RequestsPerMinute, CreatedAt: r.CreatedAt, CreatedBy: r.CreatedBy,
		ExpiresAt: r.ExpiresAt, RevokedAt: r.RevokedAt, RevokedBy: r.RevokedBy}
}

// ListKeys returns the keys of tenantID ("": every key, admin keys
// included), oldest first, without their digests.
func (k *Keys) ListKeys(ctx context.Context, tenantID string) ([]tenant.APIKey, error) {
	keys, err := retry(ctx, k.log, "keys.list", idempotent, func(ctx context.Context, _ try) ([]tenant.APIKey, error) {
		rows, err := k.q.ListKeys(ctx, k.pool, tenantID)
		keys := make([]tenant.APIKey, len(rows))
		for i, r := range rows {
			keys[i] = keyOf(r)
		}
		return keys, err
	})
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	return keys, nil
}

// RevokeKey revokes key id as of the database's now(), logged as actor, and
// signals every node on KeyRevokedChannel in the same transaction. A key
// revoked before keeps its first revocation. It returns the key as revoked;
// an unknown key is tenant.ErrKeyNotFound.
func (k *Keys) RevokeKey(ctx context.Context, actor, id string) (tenant.APIKey, error) {
	// A revocation done twice keeps its first: safe to retry whatever
	// became of the first try.
	if err := retried(ctx, k.log, "admin.revoke_key", idempotent, func(ctx context.Context, _ try) error {
		return k.change(ctx, func(tx pgx.Tx) error {
			return k.q.RevokeKey(ctx, tx, dbsqlc.RevokeKeyParams{Actor: actor, KeyID: id})
		})
	}); err != nil {
		return tenant.APIKey{}, fmt.Errorf("revoke key %s: %w", id, adminError(err))
	}
	a, err := retry(ctx, k.log, "keys.read_revoked", idempotent, func(ctx context.Context, _ try) (tenant.APIKey, error) {
		r, err := k.q.Key(ctx, k.pool, id)
		return keyOf(dbsqlc.ListKeysRow(r)), err
	})
	if err != nil {
		return tenant.APIKey{}, fmt.Errorf("read revoked key %s: %w", id, err)
	}
	return a, nil
}

// LookupKey returns key id with its digest, whether it is live as of the
// database's now(), and its effective request rate. An unknown key is
// tenant.ErrKeyNotFound.
func (k *Keys) LookupKey(ctx context.Context, id string) (tenant.KeyRecord, error) {
	r, err := retry(ctx, k.log, "keys.lookup", idempotent, func(ctx context.Context, _ try) (dbsqlc.LookupKeyRow, error) {
		return k.q.LookupKey(ctx, k.pool, id)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return tenant.KeyRecord{}, fmt.Errorf("key %s: %w", id, tenant.ErrKeyNotFound)
	}
	if err != nil {
		return tenant.KeyRecord{}, fmt.Errorf("look up key %s: %w", id, err)
	}
	return tenant.KeyRecord{APIKey: keyOf(dbsqlc.ListKeysRow{KeyID: r.KeyID, TenantID: r.TenantID, Name: r.Name,
		Scopes: r.Scopes, RequestsPerMinute: r.RequestsPerMinute, CreatedAt: r.CreatedAt, CreatedBy: r.CreatedBy,
		ExpiresAt: r.ExpiresAt, RevokedAt: r.RevokedAt, RevokedBy: r.RevokedBy}),
		SecretSHA256: r.SecretSha256, Live: r.Live, EffectiveRequestsPerMinute: r.EffectiveRequestsPerMinute}, nil
}

// KeyStates returns the state of each of ids (an unknown id is not Live):
// the watcher polls it for the keys it caches and the keys with open
// streams, to stop the dead ones and to carry a changed rate (the key's own
// or its tenant's) to the keys in use.
func (k *Keys) KeyStates(ctx context.Context, ids []string) ([]tenant.KeyState, error) {
	states, err := retry(ctx, k.log, "keys.states", idempotent, func(ctx context.Context, _ try) ([]tenant.KeyState, error) {
		rows, err := k.q.KeyStates(ctx, k.pool, ids)
		states := make([]tenant.KeyState, len(rows))
		for i, r := range rows {
			states[i] = tenant.KeyState{ID: r.KeyID, Live: r.Live, EffectiveRequestsPerMinute: r.EffectiveRequestsPerMinute}
		}
		return states, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the state of %d keys: %w", len(ids), err)
	}
	return states, nil
}

// ListenRevocations is ListenKeyEvents for revocations alone.
func (k *Keys) ListenRevocations(ctx context.Context, ready func(), deliver func(keyID string)) error {
	return k.ListenKeyEvents(ctx, ready, tenant.KeyEvents{Revoked: deliver})
}

// ListenKeyEvents hands the notifications of KeyRevokedChannel and
// TenantQuotasChannel to ev, and calls ready each time the Notifier has
// (re)connected (the caller's poll of KeyStates covers what was missed
// meanwhile), until ctx ends. Without a Notifier it returns ErrNoNotifier
// at once.
func (k *Keys) ListenKeyEvents(ctx context.Context, ready func(), ev tenant.KeyEvents) error {
	on := map[string]func(string){}
	if ev.Revoked != nil {
		on[KeyRevokedChannel] = ev.Revoked
	}
	if ev.QuotasChanged != nil {
		on[TenantQuotasChannel] = ev.QuotasChanged
	}
	return k.notifier.subscribe(ctx, ready, on)
}

// keyBucketBurst: a key's bucket holds a minute of its rate, so a key of
// N requests per minute may send N at once and then N a minute.
const keyBucketBurst = time.Minute

// KeyBucket is the rate_bucket that limits key id's requests.
func KeyBucket(id string) string { return "key:" + id }

// DefineKeyRate creates key id's request bucket full (a new key may send its
// burst at once) or changes its rate (balance kept, capped at the new
// capacity). rpm must be > 0.
func (k *Keys) DefineKeyRate(ctx context.Context, id string, rpm int32) error {
	if rpm <= 0 {
		return fmt.Errorf("define the request rate of key %s: requests_per_minute must be > 0, got %d", id, rpm)
	}
	return k.rate.define(ctx, KeyBucket(id), int64(rpm), 0, keyBucketBurst, true)
}

// TakeKeyRequest takes one request from key id's bucket (DefineKeyRate
// first), fleet-wide: 0 when granted, else how long until one would be.
func (k *Keys) TakeKeyRequest(ctx context.Context, id string) (time.Duration, error) {
	return k.rate.Take(ctx, KeyBucket(id), 1, 0)
}

func setQuotasParams(actor, id string, q tenant.Quotas) dbsqlc.SetQuotasParams {
	return dbsqlc.SetQuotasParams{Actor: actor, TenantID: id, MaxRunTokens: q.MaxRunTokens,
		MaxConcurrentRuns: q.MaxConcurrentRuns, MaxTasksInFlight: q.MaxTasksInFlight,
		KeyRequestsPerMinute: q.KeyRequestsPerMinute, Headroom: q.Headroom}
}
