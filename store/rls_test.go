package store_test

import (
	"context"
	"crypto/md5" //nolint:gosec // the call id the database derives from a key, not a secret
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// testRole returns a role name unique to this test (roles are cluster-wide
// and tests share the cluster) and drops the role when the test ends.
func testRole(t *testing.T, b *testBundle, prefix string) string {
	t.Helper()
	var buf [5]byte
	if _, err := rand.Read(buf[:]); err != nil {
		t.Fatal(err)
	}
	role := prefix + "_" + hex.EncodeToString(buf[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// DROP OWNED BY drops the role's privileges in this database, so
		// that DROP ROLE may go; it is a no-op for a role never created.
		_, err := b.pool.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN
			IF EXISTS (SELECT FROM pg_roles WHERE rolname = %[1]s) THEN
				EXECUTE 'DROP OWNED BY ' || quote_ident(%[1]s);
				EXECUTE 'DROP ROLE ' || quote_ident(%[1]s);
			END IF; END $$`, "'"+role+"'"))
		if err != nil {
			t.Errorf("drop test role %s: %v", role, err)
		}
	})
	return role
}

// asRole runs f in a transaction as role (SET LOCAL ROLE), with search_path
// fanout.
func asRole(t *testing.T, b *testBundle, role string, f func(tx pgx.Tx) error) error {
	t.Helper()
	return pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, "SET LOCAL ROLE "+pgx.Identifier{role}.Sanitize()); err != nil {
			return fmt.Errorf("set role %s: %w", role, err)
		}
		return f(tx)
	})
}

// seedTenant gives tenant what every audit view shows: a ledger run with a
// settled and a held reservation (run_spend, task_spend, tenant_spend_daily,
// open_reservations, conservation_check, audit_ledger_entry), a run of the
// run store with a finished task (task_outcome), a tool write issued
// through tool_call_issue (tool_calls). admin_audit gets its rows from the
// grants. A view added later whose rows need other data must be seeded
// here: TestTenantAuditorSeesOnlyItsTenant fails on a view with no row.
func seedTenant(t *testing.T, b *testBundle, tenant string) {
	t.Helper()
	ra, err := b.ledger.OpenRun(b.ctx, budget.OpenRunParams{RunID: "L-" + tenant, TenantID: tenant, Limit: 1000, MinReservation: 1,
		Tasks: []budget.TaskBudget{{TaskID: "t0", Limit: 500}, {TaskID: "t1", Limit: 500}}})
	if err != nil {
		t.Fatalf("open run of %s: %v", tenant, err)
	}
	beginAttempts(t, b.ledger, ra)
	// A tenant budget (the tenant_budget and tenant_period_spend views).
	if _, err := b.ledger.SetTenantBudget(b.ctx, budget.TenantBudget{TenantID: tenant, Limit: 10_000,
		Period: budget.Period{Kind: budget.PeriodDay}, Actor: storetest.Actor(t, b.pool)}); err != nil {
		t.Fatalf("tenant budget of %s: %v", tenant, err)
	}
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 100, Min: 1, Holder: "n", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r.ID, Generation: 1, Actual: 60}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t1"], Want: 50, Min: 1, Holder: "n", TTL: ttl})); err != nil {
		t.Fatal(err)
	}
	var issued string
	if err := b.pool.QueryRow(b.ctx, `SELECT tool_call_issue($1, $2, $3, $4, 't0', 1, 0, 0, '', 'files__write', $5, '')`,
		int64(ra.Tasks["t0"]), "key-"+tenant, tenant, "L-"+tenant, strings.Repeat("ab", 32)).Scan(&issued); err != nil || issued != "issued" {
		t.Fatalf("issue a tool write of %s: %q, %v", tenant, issued, err)
	}
	// A write that waited for approval, and its decision
	// (tool_call_decisions).
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO run_tool_policy (tenant_id, run_id, tool, approval, approval_timeout_ms)
		VALUES ($1, $2, 'files__delete', true, 60000), ($1, $2, 'files__write', false, 0)`, tenant, "L-"+tenant); err != nil {
		t.Fatal(err)
	}
	if err := b.pool.QueryRow(b.ctx, `SELECT tool_call_issue($1, $2, $3, $4, 't0', 1, 0, 1, '', 'files__delete', $5, '{}')`,
		int64(ra.Tasks["t0"]), "key2-"+tenant, tenant, "L-"+tenant, strings.Repeat("cd", 32)).Scan(&issued); err != nil || issued != "awaiting_approval" {
		t.Fatalf("ask for the approval of a tool write of %s: %q, %v", tenant, issued, err)
	}
	if _, err := store.NewToolCalls(b.pool, store.ToolCallsConfig{}).Decide(b.ctx, tenant, "tc_"+md5hex("key2-"+tenant), false,
		"key:fk_0000000000000000", "no"); err != nil {
		t.Fatalf("deny a tool write of %s: %v", tenant, err)
	}

	rs := store.NewRuns(b.pool)
	run := draftRun("R-"+tenant, tenant, "k-"+tenant, "t0")
	run.Spec.Goal = "the secret goal of " + tenant
	if _, _, err := rs.CreateRun(b.ctx, run, "n"); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.StartTask(b.ctx, "R-"+tenant, "n", &fanoutv1.TaskStarted{TaskId: "t0", Worker: "w"}); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.FinishTask(b.ctx, "R-"+tenant, "n", &fanoutv1.TaskOutcome{TaskId: "t0",
		Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED, TokensSpent: 60, Worker: "w",
		Summary: &fanoutv1.FactSummary{Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED, Error: "no"}}); err != nil {
		t.Fatal(err)
	}
	// A continuation (run_continuation, run_continuations), as
	// ledger_continue_run records one.
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO run_continuation (run_id, seq, tenant_id, idempotency_key, added_tokens,
		limit_after, spent_before, reopened, actor) VALUES ($1, 1, $2, 'more', 100, 1100, 60, false, 'key:fk_0000000000000000')`,
		"R-"+tenant, tenant); err != nil {
		t.Fatal(err)
	}
}

// auditViews lists the views of schema fanout that role may read.
func auditViews(t *testing.T, b *testBundle, role string) []string {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT c.relname FROM pg_class c
		 WHERE c.relnamespace = 'fanout'::regnamespace AND c.relkind = 'v'
		   AND has_table_privilege($1, c.oid, 'SELECT') ORDER BY c.relname`, role)
	if err != nil {
		t.Fatal(err)
	}
	views, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return views
}

// tenantsIn returns, as role, the distinct tenant_id of view and its row count.
func tenantsIn(t *testing.T, b *testBundle, role, view string) ([]string, int, error) {
	t.Helper()
	var tenants []string
	var n int
	err := asRole(t, b, role, func(tx pgx.Tx) error {
		return tx.QueryRow(b.ctx, `SELECT coalesce(array_agg(DISTINCT tenant_id ORDER BY tenant_id), '{}'), count(*) FROM fanout.`+
			pgx.Identifier{view}.Sanitize()).Scan(&tenants, &n)
	})
	return tenants, n, err
}

// TestTenantAuditorSeesOnlyItsTenant: every audit view (taken from the
// catalog, so a view added later is covered) is security_invoker and
// granted to fanout_tenant_auditor exactly when fanout_auditor may read
// it; as acme's auditor each returns acme's rows and only those, as
// globex's auditor only globex's, as fanout_auditor both tenants'. A
// tenant auditor reads no column no view shows (run.spec, api_key,
// audit_role), a role never granted reads nothing, and a member of
// fanout_tenant_auditor with no tenant sees no row. A view created later
// is covered once audit_refresh runs again. The node role still reads
// every view it may.
func TestTenantAuditorSeesOnlyItsTenant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seedTenant(t, b, "acme")
	seedTenant(t, b, "globex")
	acme, globex := testRole(t, b, "acme_aud"), testRole(t, b, "globex_aud")
	for tenant, role := range map[string]string{"acme": acme, "globex": globex} {
		res, err := store.NewAudit(b.pool).Grant(b.ctx, tenant, role)
		if err != nil || !res.RoleCreated || res.AlreadyGranted {
			t.Fatalf("audit grant %s to %s: %+v, %v; want the role created", tenant, role, res, err)
		}
	}
	if res, err := store.NewAudit(b.pool).Grant(b.ctx, "acme", acme); err != nil || res.RoleCreated || !res.AlreadyGranted {
		t.Errorf("audit grant again: %+v, %v; want already granted, nothing created", res, err)
	}

	views := auditViews(t, b, "fanout_auditor")
	if tv := auditViews(t, b, "fanout_tenant_auditor"); !slices.Equal(tv, views) {
		t.Errorf("fanout_tenant_auditor reads views %v, fanout_auditor %v; want the same", tv, views)
	}
	for _, want := range []string{"admin_audit", "audit_ledger_entry", "conservation_check", "open_reservations",
		"run_spend", "task_outcome", "task_spend", "tenant_spend_daily", "tool_calls"} {
		if !slices.Contains(views, want) {
			t.Errorf("the auditor may not read %s (reads %v)", want, views)
		}
	}
	var definer []string
	rows, err := b.pool.Query(b.ctx, `SELECT c.relname FROM pg_class c
		 WHERE c.relnamespace = 'fanout'::regnamespace AND c.relkind = 'v'
		   AND NOT coalesce('security_invoker=true' = ANY (c.reloptions), false) ORDER BY 1`)
	if err == nil {
		definer, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil || len(definer) > 0 {
		t.Errorf("views without security_invoker (they read as their owner, who bypasses row-level security): %v, %v", definer, err)
	}

	checkViews := func(views []string) {
		t.Helper()
		for _, v := range views {
			for role, want := range map[string]string{acme: "acme", globex: "globex"} {
				got, n, err := tenantsIn(t, b, role, v)
				if err != nil || n == 0 || !slices.Equal(got, []string{want}) {
					t.Errorf("%s as %s's auditor: tenants %v in %d rows, %v; want %s's rows only, at least one (seed it in seedTenant)",
						v, want, got, n, err, want)
				}
			}
			got, _, err := tenantsIn(t, b, "fanout_auditor", v)
			if err != nil || !slices.Contains(got, "acme") || !slices.Contains(got, "globex") {
				t.Errorf("%s as fanout_auditor: tenants %v, %v; want acme and globex", v, got, err)
			}
		}
	}
	checkViews(views)

	for _, sql := range []string{
		"SELECT spec FROM fanout.run",
		"SELECT spec->>'goal' FROM fanout.run",
		"SELECT * FROM fanout.run",
		"SELECT * FROM fanout.api_key",
		"SELECT key_id FROM fanout.api_key",
		"SELECT * FROM fanout.audit_role",
		"SELECT * FROM fanout.account",
		"SELECT requested FROM fanout.reservation",
		"SELECT event FROM fanout.run_event",
		"SELECT outcome FROM fanout.task",
		"SELECT result FROM fanout.tool_call",
		"SELECT fanout.audit_grant('x', 'acme', 'someone')",
		"SELECT fanout.audit_refresh()",
	} {
		err := asRole(t, b, acme, func(tx pgx.Tx) error { _, err := tx.Exec(b.ctx, sql); return err })
		if code := sqlState(err); code != "42501" {
			t.Errorf("as acme's auditor: %s: err = %v (SQLSTATE %q), want insufficient_privilege", sql, err, code)
		}
	}
	// Where a column is granted (a view reads it), the table itself is
	// row-secured too.
	var direct []string
	if err := asRole(t, b, acme, func(tx pgx.Tx) error {
		return tx.QueryRow(b.ctx, "SELECT array_agg(DISTINCT tenant_id) FROM fanout.account").Scan(&direct)
	}); err != nil || !slices.Equal(direct, []string{"acme"}) {
		t.Errorf("account.tenant_id read directly as acme's auditor: %v, %v; want acme only", direct, err)
	}

	// A role never granted reads nothing; a bare member of the group (no
	// audit_role row) sees no row.
	stranger, bare := testRole(t, b, "stranger"), testRole(t, b, "bare_aud")
	if _, err := b.pool.Exec(b.ctx, fmt.Sprintf("CREATE ROLE %s NOLOGIN; CREATE ROLE %s NOLOGIN IN ROLE fanout_tenant_auditor", stranger, bare)); err != nil {
		t.Fatal(err)
	}
	for _, v := range views {
		if _, _, err := tenantsIn(t, b, stranger, v); sqlState(err) != "42501" {
			t.Errorf("%s as a role never granted: err = %v, want insufficient_privilege", v, err)
		}
		if got, n, err := tenantsIn(t, b, bare, v); err != nil || n != 0 {
			t.Errorf("%s as a tenant auditor of no tenant: tenants %v in %d rows, %v; want no row", v, got, n, err)
		}
	}

	// A view added by a later migration is covered once it calls audit_refresh.
	if _, err := b.pool.Exec(b.ctx, `CREATE VIEW fanout.run_state_test AS SELECT tenant_id, run_id, state FROM fanout.run;
		GRANT SELECT ON fanout.run_state_test TO fanout_auditor;
		SELECT fanout.audit_refresh();`); err != nil {
		t.Fatal(err)
	}
	checkViews([]string{"run_state_test"})
	err = asRole(t, b, acme, func(tx pgx.Tx) error { _, err := tx.Exec(b.ctx, "SELECT spec FROM fanout.run"); return err })
	if sqlState(err) != "42501" {
		t.Errorf("after a view of run: run.spec as acme's auditor: %v, want insufficient_privilege", err)
	}

	// The node role reads every view it may, and writes as before (the
	// other store tests run the node's paths).
	node := nodeConn(t, b)
	for _, v := range auditViews(t, b, "fanout_app") {
		var n int
		if err := node.QueryRow(b.ctx, "SELECT count(*) FROM fanout."+pgx.Identifier{v}.Sanitize()).Scan(&n); err != nil {
			t.Errorf("node role: view %s: %v", v, err)
		}
	}

	// Revoked: the role keeps existing and reads nothing.
	left, err := store.NewAudit(b.pool).Revoke(b.ctx, "acme", acme)
	if err != nil || left != 0 {
		t.Fatalf("audit revoke: %d left, %v", left, err)
	}
	if _, _, err := tenantsIn(t, b, acme, "run_spend"); sqlState(err) != "42501" {
		t.Errorf("run_spend after the revoke: err = %v, want insufficient_privilege", err)
	}
	var actions []string
	rows, err = b.pool.Query(b.ctx, "SELECT action || ' ' || tenant_id || ' ' || (detail->>'role') FROM admin_action WHERE action LIKE 'audit.%' ORDER BY action_id")
	if err == nil {
		actions, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil || len(actions) != 4 || actions[3] != "audit.revoke acme "+acme || !strings.HasPrefix(actions[0], "audit.grant ") {
		t.Errorf("admin_action: %v, %v; want three grants and the revoke", actions, err)
	}
}

// TestAuditGrantRefusesFanoutRoles: a grant to one of fanout's own roles, a
// superuser, a role that already reads every tenant (a node role), a
// malformed name, or for an unknown tenant is refused with the reason, and
// nothing is written: no role, no grant, no log entry.
func TestAuditGrantRefusesFanoutRoles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seedTenant(t, b, "acme")
	storetest.NodeURL(t, b.url) // creates the node role
	var owner string
	if err := b.pool.QueryRow(b.ctx, "SELECT current_user").Scan(&owner); err != nil {
		t.Fatal(err)
	}
	fresh := testRole(t, b, "fresh_aud")
	for _, tc := range []struct{ tenant, role, want string }{
		{"acme", "fanout_app", "fanout's own roles"},
		{"acme", "fanout_auditor", "fanout's own roles"},
		{"acme", "fanout_tenant_auditor", "fanout's own roles"},
		{"acme", owner, "fanout's own roles"},
		{"acme", storetest.NodeRole, "member of fanout_app"},
		{"acme", "Acme-Auditor", "lowercase letters"},
		{"acme", "", "lowercase letters"},
		{"acme", strings.Repeat("a", 64), "1 to 63"},
		{"acme", "pg_monitor", "pg_"},
		{"nope", fresh, "tenant nope: not found"},
		{"", fresh, "tenant: must be 1 to 128"},
	} {
		_, err := store.NewAudit(b.pool).Grant(b.ctx, tc.tenant, tc.role)
		if !errors.Is(err, store.ErrAuditRefused) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("audit grant %q to %q: %v; want refused with %q", tc.tenant, tc.role, err, tc.want)
		}
	}
	var roles, logged, rows int
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM pg_roles WHERE rolname = $1),
		(SELECT count(*) FROM admin_action WHERE action LIKE 'audit.%'), (SELECT count(*) FROM audit_role)`, fresh).Scan(&roles, &logged, &rows); err != nil {
		t.Fatal(err)
	}
	if roles != 0 || logged != 0 || rows != 0 {
		t.Errorf("after refused grants: role created %d, admin_action rows %d, audit_role rows %d; want none", roles, logged, rows)
	}
	if _, err := store.NewAudit(b.pool).Revoke(b.ctx, "acme", fresh); !errors.Is(err, store.ErrAuditRefused) ||
		!strings.Contains(err.Error(), "does not audit tenant acme") {
		t.Errorf("revoke of a grant that does not exist: %v, want refused", err)
	}
	// A superuser, when the test's owner is one.
	var super bool
	if err := b.pool.QueryRow(b.ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super); err != nil {
		t.Fatal(err)
	}
	if super {
		su := testRole(t, b, "su_aud")
		if _, err := b.pool.Exec(b.ctx, "CREATE ROLE "+su+" SUPERUSER NOLOGIN"); err != nil {
			t.Fatal(err)
		}
		if _, err := store.NewAudit(b.pool).Grant(b.ctx, "acme", su); !errors.Is(err, store.ErrAuditRefused) || !strings.Contains(err.Error(), "superuser") {
			t.Errorf("audit grant to a superuser: %v, want refused", err)
		}
	}
}

func md5hex(s string) string {
	sum := md5.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}
