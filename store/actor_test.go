package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
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
