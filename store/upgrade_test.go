package store_test

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// restoreSchema21 returns the URL of a new database holding the fixture
// testdata/schema21.sql.gz: a populated database that the last release with
// the full migration history (1 to 21) made. It is dropped when t passes.
func restoreSchema21(t *testing.T, ctx context.Context) string {
	t.Helper()
	storetest.NewDB(t) // the template's migration makes fanout's cluster-wide roles
	admin := storetest.ServerURL(t)
	name := fmt.Sprintf("upgrade21_%06x", rand.N(1<<24))
	adminConn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = adminConn.Close(context.WithoutCancel(ctx)) }()
	// The fixture's tenant auditor, a role of the cluster it was made on.
	if _, err := adminConn.Exec(ctx, `DO $$ BEGIN CREATE ROLE acme_auditor NOLOGIN;
		EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := adminConn.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE template0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kept the upgraded database %s", name)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, admin); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = c.Close(ctx)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name

	f, err := os.Open("testdata/schema21.sql.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	dump, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, string(dump)); err != nil {
		t.Fatalf("restore the schema-21 fixture: %v", err)
	}
	return u.String()
}

// fixtureCounts are the rows of every table that holds the users' data, and
// the ledger's totals.
const fixtureCounts = `SELECT format('runs %s tasks %s events %s tool_calls %s keys %s revoked %s tenants %s accounts %s reservations %s entries %s spent %s admin %s auditors %s prices %s periods %s migrations %s',
	(SELECT count(*) FROM fanout.run), (SELECT count(*) FROM fanout.task), (SELECT count(*) FROM fanout.run_event),
	(SELECT count(*) FROM fanout.tool_call), (SELECT count(*) FROM fanout.api_key),
	(SELECT count(*) FROM fanout.api_key WHERE revoked_at IS NOT NULL), (SELECT count(*) FROM fanout.tenant),
	(SELECT count(*) FROM fanout.account), (SELECT count(*) FROM fanout.reservation), (SELECT count(*) FROM fanout.ledger_entry),
	(SELECT sum(spent) FROM fanout.account WHERE kind = 'run'), (SELECT count(*) FROM fanout.admin_action),
	(SELECT count(*) FROM fanout.audit_role), (SELECT count(*) FROM fanout.price), (SELECT count(*) FROM fanout.tenant_period),
	(SELECT string_agg(version::text, ',' ORDER BY version) FROM public.schema_migration))`

// TestUpgradeFromSchema21: a database that an earlier release migrated to
// schema 21, with runs, tasks, events, tool calls, keys, tenant budgets,
// prices and a tenant auditor, is upgraded in place: no row is lost, the
// ledger still conserves and still works, keys still authenticate, and the
// schema it ends with is exactly a fresh install's.
func TestUpgradeFromSchema21(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	old := restoreSchema21(t, ctx)

	pool, err := store.Open(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// Two failed writes as schema 21 kept them: one never sent (0025 makes
	// it not_sent), one whose tool's own text says "not sent" (it stays
	// failed: only the loop's prefix counted).
	if _, err := pool.Exec(ctx, `INSERT INTO fanout.tool_call (key, tenant_id, run_id, task_id, attempt, iteration,
			call_index, server, tool, args_digest, state, error, resolved_at)
		SELECT key || v.suffix, tenant_id, run_id, task_id, attempt, iteration, call_index + v.n, server, tool,
		       args_digest, 'failed', v.error, now()
		  FROM (SELECT * FROM fanout.tool_call ORDER BY key LIMIT 1) c,
		       (VALUES ('/never', 100, 'not sent: no slot within the call''s timeout'),
		               ('/own', 101, 'the tool reported: not sent: mailbox full')) AS v(suffix, n, error)`); err != nil {
		t.Fatal(err)
	}
	var before, after string
	if err := pool.QueryRow(ctx, fixtureCounts).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(before, "runs 3 ") || strings.Contains(before, "tool_calls 0 ") || !strings.Contains(before, "revoked 1 ") {
		t.Fatalf("the fixture is not what this test expects: %s", before)
	}

	done, err := store.Apply(ctx, old)
	if err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	// Since schema 21: every versioned migration after the baseline, and
	// the definitions applied; the signatures that changed since 21
	// dropped: price_set took a reason (0022), the worker's functions an
	// attempt's secret (0024).
	all, err := store.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var later []int
	migrated := ""
	for _, m := range all {
		if m.Version > store.Baseline {
			later = append(later, m.Version)
			migrated += fmt.Sprintf(",%d", m.Version)
		}
	}
	wantDropped := []string{
		// tool_call_transition took its place (migration 0028).
		"trigger tool_call_resolve_once on tool_call",
		"function tool_call_resolve_once()",
		"function tool_call_issue(bigint,text,text,text,text,bigint,integer,integer,text,text,text)",
		"function price_set(text,text,timestamp with time zone,numeric,numeric,text)",
		"function ledger_void(bigint,bigint,text)",
		"function ledger_settle(bigint,bigint,bigint,boolean,text,bigint,bigint)",
		"function ledger_reserve(bigint,text,text,bigint,bigint,bigint,text,interval,text,text)",
		"function ledger_renew(bigint,bigint,interval)",
		// Each took a tenant's headroom (migration 0033), defaulting to NULL.
		"function admin_set_quotas(text,text,bigint,integer,integer,integer)",
		"function admin_create_tenant(text,text,bigint,integer,integer,integer)",
		"function admin_check_quotas(bigint,integer,integer,integer)",
	}
	if fmt.Sprint(done.Versions) != fmt.Sprint(later) || !done.Redefined || fmt.Sprint(done.Dropped) != fmt.Sprint(wantDropped) {
		t.Errorf("upgrade did %+v; want versions %v, the definitions applied, %v dropped", done, later, wantDropped)
	}
	if err := pool.QueryRow(ctx, fixtureCounts).Scan(&after); err != nil {
		t.Fatal(err)
	}
	var moved string
	if err := pool.QueryRow(ctx, `SELECT string_agg(state || ': ' || error, ' | ' ORDER BY key) FROM fanout.tool_call
		WHERE key LIKE '%/never' OR key LIKE '%/own'`).Scan(&moved); err != nil {
		t.Fatal(err)
	}
	if want := "not_sent: no slot within the call's timeout | failed: the tool reported: not sent: mailbox full"; moved != want {
		t.Errorf("schema 21's failed writes after the upgrade: %q; want %q", moved, want)
	}
	if after != before+migrated {
		t.Errorf("rows after the upgrade:\n  %s\nbefore:\n  %s", after, before)
	}
	b := &testBundle{ctx: ctx, url: old, pool: pool, ledger: store.NewLedger(pool)}
	b.checkConserved(t)

	// The ledger works on the upgraded schema: a new run of the fixture's
	// tenant acme (which has a day budget) reserves and settles.
	ra, err := b.ledger.OpenRun(ctx, budget.OpenRunParams{RunID: "after-upgrade", TenantID: "acme", Limit: 5000, MinReservation: 100,
		Tasks: []budget.TaskBudget{{TaskID: "t0", Limit: 2000}}})
	if err != nil {
		t.Fatalf("open a run after the upgrade: %v", err)
	}
	beginAttempts(t, b.ledger, ra)
	r, err := b.ledger.Reserve(ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 1000, Min: 100, Holder: "n", TTL: ttl}))
	if err != nil || r.Amount != 1000 {
		t.Fatalf("reserve after the upgrade: %+v, %v", r, err)
	}
	if _, err := b.ledger.Settle(ctx, budget.SettleParams{Reservation: r.ID, Generation: 1, Actual: 600}); err != nil {
		t.Fatalf("settle after the upgrade: %v", err)
	}
	b.checkConserved(t)

	// The fixture's live key still authenticates, its revoked one does not.
	keys := store.NewKeys(pool, nil)
	if k, err := keys.LookupKey(ctx, "fk_aa4ba4b305fc902d"); err != nil || k.TenantID != "acme" || k.RevokedAt != nil {
		t.Errorf("acme's key after the upgrade: %+v, %v", k, err)
	}
	if k, err := keys.LookupKey(ctx, "fk_64efb8279a2302c1"); err != nil || k.RevokedAt == nil {
		t.Errorf("globex's revoked key after the upgrade: %+v, %v", k, err)
	}

	// The schema is a fresh install's. The fixture's own tenant auditor
	// role holds a grant a fresh install has no reason to have: it is data.
	fresh := storetest.NewDB(t)
	if got, want := describeURL(t, ctx, old, "acme_auditor"), describeURL(t, ctx, fresh, "acme_auditor"); got != want {
		t.Errorf("the upgraded schema differs from a fresh install's:\n%s", lineDiff(want, got))
	}
}

// describeURL describes the schema of the database at u, leaving out the
// lines that name role skip.
func describeURL(t *testing.T, ctx context.Context, u, skip string) string {
	t.Helper()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	d, err := store.DescribeSchema(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	var keep []string
	for l := range strings.SplitSeq(d, "\n") {
		if !strings.Contains(l, skip) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
