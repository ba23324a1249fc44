package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fanout/fanout/auth"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/tenant"
)

// TestAdminFunctionsCheckTheirActor (issue 23, item 5): logged in as the
// admin role (AdminService's login), every admin function that takes an
// actor refuses one that is not the session's role or a live admin key — a
// budget set or a price set under a forged "role:postgres" is refused, and
// nothing is written or logged; so is "anonymous" until the owner opts the
// database in (`fanout dev`). Under its own role the same calls are taken.
func TestAdminFunctionsCheckTheirActor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	node, err := pgx.Connect(b.ctx, storetest.AdminURL(t, b.url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Close(context.Background()) })
	var self string
	if err := node.QueryRow(b.ctx, "SELECT 'role:' || session_user").Scan(&self); err != nil {
		t.Fatal(err)
	}
	calls := map[string]string{
		"ledger_set_tenant_budget": `SELECT * FROM fanout.ledger_set_tenant_budget($1, 'globex', 999999999, 'none', NULL)`,
		"price_set":                `SELECT * FROM fanout.price_set($1, 'gpt-4o-mini', now() + interval '1 day', 0, 0)`,
		"admin_create_tenant":      `SELECT * FROM fanout.admin_create_tenant($1, 'initech', NULL, NULL, NULL, NULL)`,
	}
	for name, sql := range calls {
		for _, forged := range []string{"role:postgres", "key:fk_nobody", "anonymous"} {
			_, err := node.Exec(b.ctx, sql, forged)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
				t.Errorf("%s as the admin role under actor %q: %v; want insufficient_privilege", name, forged, err)
			}
		}
	}
	var logged int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM admin_action`).Scan(&logged); err != nil || logged != 0 {
		t.Errorf("admin_action rows after the refused calls = %d, %v; want 0", logged, err)
	}
	for name, sql := range calls {
		if _, err := node.Exec(b.ctx, sql, self); err != nil {
			t.Errorf("%s as the admin role under its own actor %s: %v", name, self, err)
		}
	}
	if err := store.AllowAnonymousAdmin(b.ctx, b.url); err != nil {
		t.Fatal(err)
	}
	if _, err := node.Exec(b.ctx, `SELECT * FROM fanout.admin_create_tenant('anonymous', 'hooli', NULL, NULL, NULL, NULL)`); err != nil {
		t.Errorf("admin_create_tenant as anonymous in a database opted in: %v", err)
	}
}

// liveKey creates a key of tenantID ("": an admin key) holding scopes, as
// the owner (creating the tenant if it has none), and returns its actor
// ("key:ID") and its secret as a caller presents it.
func liveKey(t *testing.T, b *testBundle, tenantID string, scopes ...string) (actor, secret string) {
	t.Helper()
	keys := store.NewKeys(b.pool, nil)
	owner := storetest.Actor(t, b.pool)
	if tenantID != "" {
		if _, err := keys.CreateTenant(b.ctx, owner, tenantID, tenant.Quotas{}); err != nil && !errors.Is(err, tenant.ErrTenantExists) {
			t.Fatal(err)
		}
	}
	id, token, digest, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keys.CreateKey(b.ctx, tenant.CreateKeyParams{Actor: owner, KeyID: id, TenantID: tenantID, Scopes: scopes,
		SecretSHA256: digest}); err != nil {
		t.Fatal(err)
	}
	return "key:" + id, strings.TrimPrefix(token, "fanout_"+id+"_")
}

// TestAdminLoginCannotActAsAKeyWithoutItsSecret (issue 40, item 6): logged
// in as AdminService's login, ledger_set_tenant_budget, price_set,
// admin_create_key and every other admin function refuse to act as a live
// admin key unless this transaction presented that key's own secret
// (fanout.actor_secret): not with none, not with another key's, not with a
// tenant key's, not as a revoked key with its secret. Nothing is written
// or logged, and no error names a secret. With the key's secret each call
// is taken and the admin log names the key.
func TestAdminLoginCannotActAsAKeyWithoutItsSecret(t *testing.T) {
	t.Parallel()
	b := setup(t)
	admin, secret := liveKey(t, b, "", "admin")
	other, otherSecret := liveKey(t, b, "", "admin")
	_, tenantSecret := liveKey(t, b, "acme", "run", "read", "approve")
	revoked, revokedSecret := liveKey(t, b, "", "admin")
	if _, err := store.NewKeys(b.pool, nil).RevokeKey(b.ctx, storetest.Actor(t, b.pool), strings.TrimPrefix(revoked, "key:")); err != nil {
		t.Fatal(err)
	}
	node, err := pgx.Connect(b.ctx, storetest.AdminURL(t, b.url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Close(context.Background()) })
	newID, _, digest, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	calls := []struct{ name, sql string }{
		{"ledger_set_tenant_budget", `SELECT * FROM fanout.ledger_set_tenant_budget($1, 'globex', 999999999, 'none', NULL)`},
		{"price_set", `SELECT * FROM fanout.price_set($1, 'gpt-4o-mini', now() + interval '1 day', 0, 0)`},
		{"admin_create_key", `SELECT fanout.admin_create_key($1, '` + newID + `', NULL, 'minted', '{admin}', '\x` +
			hexString(digest) + `'::bytea, NULL, NULL)`},
		{"admin_create_tenant", `SELECT * FROM fanout.admin_create_tenant($1, 'initech', NULL, NULL, NULL, NULL)`},
		{"admin_set_quotas", `SELECT * FROM fanout.admin_set_quotas($1, 'acme', 5, NULL, NULL, NULL)`},
		{"admin_revoke_key", `SELECT fanout.admin_revoke_key($1, '` + strings.TrimPrefix(other, "key:") + `')`},
	}
	// call runs sql as actor in one transaction that first presents
	// presented ("": none).
	call := func(sql, actor, presented string) error {
		return pgx.BeginFunc(b.ctx, node, func(tx pgx.Tx) error {
			if presented != "" {
				if _, err := tx.Exec(b.ctx, `SELECT set_config('fanout.actor_secret', $1, true)`, presented); err != nil {
					return err
				}
			}
			_, err := tx.Exec(b.ctx, sql, actor)
			return err
		})
	}
	before := len(adminLog(t, b))
	for _, c := range calls {
		for _, f := range []struct{ who, actor, presented string }{
			{"a live admin key, no secret", admin, ""},
			{"a live admin key, another admin key's secret", admin, otherSecret},
			{"a live admin key, a tenant key's secret", admin, tenantSecret},
			{"a revoked admin key, its own secret", revoked, revokedSecret},
		} {
			err := call(c.sql, f.actor, f.presented)
			if sqlState(err) != "42501" {
				t.Errorf("%s as the admin login under %s: %v; want insufficient_privilege", c.name, f.who, err)
			}
			for _, s := range []string{secret, otherSecret, tenantSecret, revokedSecret} {
				if err != nil && strings.Contains(err.Error(), s) {
					t.Errorf("%s: the error names a secret: %v", c.name, err)
				}
			}
		}
	}
	if after := adminLog(t, b); len(after) != before {
		t.Errorf("admin log after the refused calls: %d rows, was %d: %v", len(after), before, after[before:])
	}
	var written int
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM price) + (SELECT count(*) FROM api_key WHERE key_id = $1)
		+ (SELECT count(*) FROM tenant WHERE tenant_id IN ('globex', 'initech'))
		+ (SELECT count(*) FROM api_key WHERE revoked_at IS NOT NULL AND key_id <> $2)`,
		newID, strings.TrimPrefix(revoked, "key:")).Scan(&written); err != nil || written != 0 {
		t.Errorf("rows written by the refused calls: %d, %v; want 0", written, err)
	}
	for _, c := range calls {
		if err := call(c.sql, admin, secret); err != nil {
			t.Errorf("%s as the admin login under %s with its secret: %v", c.name, admin, err)
		}
	}
	for _, r := range adminLog(t, b)[before:] {
		if r.actor != admin {
			t.Errorf("admin log row %+v; want actor %s", r, admin)
		}
	}
	if n := len(adminLog(t, b)) - before; n < len(calls) {
		t.Errorf("admin log rows for the proven calls: %d; want at least %d", n, len(calls))
	}
}
