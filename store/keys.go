package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/tenant"
)

// Keys is the store of tenants and API keys. Every change goes through the
// admin functions (migrations/functions/admin_*.sql), which log it in admin_action in the
// same transaction; reads are plain SELECTs (fanout_app may read api_key
// and tenant).
type Keys struct {
	pool     *pgxpool.Pool
	notifier *Notifier
	rate     *RateLimiter
	log      *slog.Logger // its retries'
}

// NewKeys returns the key store on pool, hearing key events from n (nil
// when ListenKeyEvents is not called).
func NewKeys(pool *Pool, n *Notifier) *Keys {
	return &Keys{pool: pool, notifier: n, rate: NewRateLimiter(pool), log: slog.Default()}
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

const tenantColumns = `tenant_id, max_run_tokens, max_concurrent_runs, max_tasks_in_flight, key_requests_per_minute, created_at, updated_at`

func scanTenant(row pgx.Row) (tenant.Tenant, error) {
	var t tenant.Tenant
	err := row.Scan(&t.ID, &t.MaxRunTokens, &t.MaxConcurrentRuns, &t.MaxTasksInFlight, &t.KeyRequestsPerMinute, &t.CreatedAt, &t.UpdatedAt)
	return t, err
}

// CreateTenant creates tenant id with quotas q, logged as actor. A tenant
// that exists is ErrTenantExists (creates are not idempotent: change an
// existing tenant's quotas with SetQuotas); bad arguments are
// tenant.ErrAdminInvalid naming the field.
func (k *Keys) CreateTenant(ctx context.Context, actor, id string, q tenant.Quotas) (tenant.Tenant, error) {
	t, err := retry(ctx, k.log, "admin.create_tenant", unsentOnly, func(ctx context.Context, _ try) (tenant.Tenant, error) {
		return scanTenant(k.pool.QueryRow(ctx, `SELECT `+tenantColumns+` FROM admin_create_tenant($1, $2, $3, $4, $5, $6)`,
			actor, id, q.MaxRunTokens, q.MaxConcurrentRuns, q.MaxTasksInFlight, q.KeyRequestsPerMinute))
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
		return scanTenant(k.pool.QueryRow(ctx, `SELECT `+tenantColumns+` FROM admin_set_quotas($1, $2, $3, $4, $5, $6)`,
			actor, id, q.MaxRunTokens, q.MaxConcurrentRuns, q.MaxTasksInFlight, q.KeyRequestsPerMinute))
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
		err := pgx.BeginFunc(ctx, k.pool, func(tx pgx.Tx) error {
			// The tenant's row first: a missing tenant is refused before the
			// budget function would create it (tenants are never deleted).
			var err error
			if t, err = scanTenant(tx.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenant WHERE tenant_id = $1`, p.TenantID)); err != nil {
				if errors.Is(err, pgx.ErrNoRows) {
					return tenant.ErrTenantNotFound
				}
				return err
			}
			if q := p.Quotas; q != nil {
				if t, err = scanTenant(tx.QueryRow(ctx, `SELECT `+tenantColumns+` FROM admin_set_quotas($1, $2, $3, $4, $5, $6)`,
					p.Actor, p.TenantID, q.MaxRunTokens, q.MaxConcurrentRuns, q.MaxTasksInFlight, q.KeyRequestsPerMinute)); err != nil {
					return adminError(err)
				}
			}
			if p.Budget != nil {
				var every *time.Duration
				if b.Period.Kind == budget.PeriodEvery {
					every = &b.Period.Every
				}
				var minRes *int64
				if b.MinReservation > 0 {
					minRes = &b.MinReservation
				}
				if _, err := tx.Exec(ctx, `SELECT ledger_set_tenant_budget($1, $2, $3, $4, $5, $6)`,
					b.Actor, b.TenantID, b.Limit, string(b.Period.Kind), every, minRes); err != nil {
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
		return scanTenant(k.pool.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenant WHERE tenant_id = $1`, id))
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
		err := k.pool.QueryRow(ctx, `SELECT admin_create_key($1, $2, $3, $4, $5, $6, $7, $8)`,
			p.Actor, p.KeyID, tenantID, p.Name, p.Scopes, p.SecretSHA256, optInt32(p.RequestsPerMinute), expires).Scan(&created)
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

const keyColumns = `k.key_id, coalesce(k.tenant_id, ''), k.name, k.scopes, k.requests_per_minute, k.created_at,
	k.created_by, k.expires_at, k.revoked_at, coalesce(k.revoked_by, '')`

func scanKey(row pgx.Row, extra ...any) (tenant.APIKey, error) {
	var a tenant.APIKey
	err := row.Scan(append([]any{&a.ID, &a.TenantID, &a.Name, &a.Scopes, &a.RequestsPerMinute, &a.CreatedAt, &a.CreatedBy,
		&a.ExpiresAt, &a.RevokedAt, &a.RevokedBy}, extra...)...)
	return a, err
}

// ListKeys returns the keys of tenantID ("": every key, admin keys
// included), oldest first, without their digests.
func (k *Keys) ListKeys(ctx context.Context, tenantID string) ([]tenant.APIKey, error) {
	keys, err := retry(ctx, k.log, "keys.list", idempotent, func(ctx context.Context, _ try) ([]tenant.APIKey, error) {
		rows, err := k.pool.Query(ctx, `SELECT `+keyColumns+` FROM api_key k
			WHERE $1 = '' OR k.tenant_id = $1 ORDER BY k.created_at, k.key_id`, tenantID)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, func(row pgx.CollectableRow) (tenant.APIKey, error) { return scanKey(row) })
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
		_, err := k.pool.Exec(ctx, `SELECT admin_revoke_key($1, $2)`, actor, id)
		return err
	}); err != nil {
		return tenant.APIKey{}, fmt.Errorf("revoke key %s: %w", id, adminError(err))
	}
	a, err := retry(ctx, k.log, "keys.read_revoked", idempotent, func(ctx context.Context, _ try) (tenant.APIKey, error) {
		return scanKey(k.pool.QueryRow(ctx, `SELECT `+keyColumns+` FROM api_key k WHERE k.key_id = $1`, id))
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
	var r tenant.KeyRecord
	var rpm int32
	a, err := retry(ctx, k.log, "keys.lookup", idempotent, func(ctx context.Context, _ try) (tenant.APIKey, error) {
		return scanKey(k.pool.QueryRow(ctx, `SELECT `+keyColumns+`, k.secret_sha256,
				k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now()),
				coalesce(k.requests_per_minute, t.key_requests_per_minute, 0)
			FROM api_key k LEFT JOIN tenant t USING (tenant_id) WHERE k.key_id = $1`, id),
			&r.SecretSHA256, &r.Live, &rpm)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return tenant.KeyRecord{}, fmt.Errorf("key %s: %w", id, tenant.ErrKeyNotFound)
	}
	if err != nil {
		return tenant.KeyRecord{}, fmt.Errorf("look up key %s: %w", id, err)
	}
	r.APIKey, r.EffectiveRequestsPerMinute = a, rpm
	return r, nil
}

// KeyStates returns the state of each of ids (an unknown id is not Live):
// the watcher polls it for the keys it caches and the keys with open
// streams, to stop the dead ones and to carry a changed rate (the key's own
// or its tenant's) to the keys in use.
func (k *Keys) KeyStates(ctx context.Context, ids []string) ([]tenant.KeyState, error) {
	states, err := retry(ctx, k.log, "keys.states", idempotent, func(ctx context.Context, _ try) ([]tenant.KeyState, error) {
		rows, err := k.pool.Query(ctx, `SELECT id,
				k.key_id IS NOT NULL AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now()),
				coalesce(k.requests_per_minute, t.key_requests_per_minute, 0)
			FROM unnest($1::text[]) id LEFT JOIN api_key k ON k.key_id = id LEFT JOIN tenant t ON t.tenant_id = k.tenant_id`, ids)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowToStructByPos[tenant.KeyState])
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
