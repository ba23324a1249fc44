package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// nodeConn connects to the test database as the node role (a member of
// fanout_app only), on one connection so that session state (TEMP tables,
// search_path) holds for every statement.
func nodeConn(t *testing.T, b *testBundle) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(storetest.NodeURL(t, b.url))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["search_path"] = store.Schema // as store.Open sets it
	conn, err := pgx.ConnectConfig(b.ctx, cfg)
	if err != nil {
		t.Fatalf("connect as the node role: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// TestNodeRoleCannotWriteTheLedger (I15): as the node role, every way to
// change a balance or the journal other than the ledger functions is
// refused, and the journal's privileges hold with its trigger out of the way.
func TestNodeRoleCannotWriteTheLedger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "roles", 1000, 1, 1000)
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 100, Min: 1, Holder: "n", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r.ID, Generation: 1, Actual: 60}); err != nil {
		t.Fatal(err)
	}
	// The privilege layer alone, without the append-only trigger's help.
	if _, err := b.pool.Exec(b.ctx, "ALTER TABLE ledger_entry DISABLE TRIGGER USER"); err != nil {
		t.Fatal(err)
	}
	node := nodeConn(t, b)
	for _, stmt := range []string{
		"UPDATE account SET spent = 0",
		"UPDATE account SET limit_tokens = limit_tokens + 1000000",
		"INSERT INTO account (tenant_id, chain, kind, limit_tokens) VALUES ('tenant-a', '{}', 'tenant', 1)",
		"DELETE FROM account",
		"UPDATE reservation SET state = 'voided'",
		"INSERT INTO ledger_entry (tenant_id, account_id, chain, kind, delta_limit) VALUES ('tenant-a', 1, '{1}', 'open', 5)",
		"UPDATE ledger_entry SET delta_spent = 0",
		"DELETE FROM ledger_entry",
		"TRUNCATE ledger_entry",
		"ALTER TABLE ledger_entry DISABLE TRIGGER USER",
		"ALTER TABLE account DROP CONSTRAINT account_within_limit",
		"CREATE FUNCTION fanout.ledger_backdoor() RETURNS int LANGUAGE sql AS 'SELECT 1'",
		"CREATE TABLE fanout.shadow (x int)",
		"SELECT ledger_check_exhausted('{1}')",
		"SELECT * FROM ledger_lock_chain('{1}')",
		"SELECT ledger_close_run(1, 'x')",
	} {
		_, err := node.Exec(b.ctx, stmt)
		if code := sqlState(err); code != "42501" && code != "42883" {
			t.Errorf("node role: %s: err = %v (SQLSTATE %q), want insufficient_privilege", stmt, err, code)
		}
	}
	if _, err := b.pool.Exec(b.ctx, "ALTER TABLE ledger_entry ENABLE TRIGGER USER"); err != nil {
		t.Fatal(err)
	}
	a, err := b.ledger.Account(b.ctx, ra.Tasks["t0"])
	if err != nil || a.Spent != 60 || a.Limit != 1000 {
		t.Errorf("task account = %+v, %v; want spent 60 of 1000, untouched", a, err)
	}
	b.checkConserved(t)

	// What a node does need still works as the node role.
	pool, err := store.Open(b.ctx, storetest.NodeURL(t, b.url))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	l := store.NewLedger(pool)
	ra2, err := l.OpenRun(b.ctx, budget.OpenRunParams{RunID: "roles-2", TenantID: "tenant-a", Limit: 500, MinReservation: 1,
		Tasks: []budget.TaskBudget{{TaskID: "t0", Limit: 500}}})
	if err != nil {
		t.Fatalf("open run as the node role: %v", err)
	}
	// A tenant budget is AdminService's to open (unlogged and without an
	// actor, ledger_open_tenant is not even that: tests and the owner).
	if _, err := l.OpenTenant(b.ctx, "tenant-n", 100); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("open tenant as the node role: %v; want permission denied", err)
	}
	beginAttempts(t, l, ra2)
	r2, err := l.Reserve(b.ctx, grant(ra2, budget.ReserveParams{Account: ra2.Tasks["t0"], Want: 50, Min: 1, Holder: "n", TTL: ttl}))
	if err != nil {
		t.Fatalf("reserve as the node role: %v", err)
	}
	if _, err := l.Renew(b.ctx, r2.ID, 1, ttl, ""); err != nil {
		t.Fatalf("renew as the node role: %v", err)
	}
	if _, err := l.Settle(b.ctx, budget.SettleParams{Reservation: r2.ID, Generation: 1, Actual: 20}); err != nil {
		t.Fatalf("settle as the node role: %v", err)
	}
	if _, err := l.ExpireLeases(b.ctx); err != nil {
		t.Fatalf("expire as the node role: %v", err)
	}
	if _, err := l.CloseRun(b.ctx, "roles-2"); err != nil {
		t.Fatalf("close as the node role: %v", err)
	}
	b.checkConserved(t)
}

// TestLedgerFunctionsIgnoreTheCallersSchemas: neither a planted function in
// a schema PUBLIC can create in (PostgreSQL 14's default for public) nor a
// TEMP table named like a ledger table changes what a ledger function does,
// whatever search_path the caller sets.
func TestLedgerFunctionsIgnoreTheCallersSchemas(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "plant", 1000, 10, 1000)
	if _, err := b.pool.Exec(b.ctx, "GRANT CREATE ON SCHEMA public TO PUBLIC"); err != nil {
		t.Fatal(err)
	}
	node := nodeConn(t, b)
	for _, stmt := range []string{
		// The attacker's record of where its code ran.
		"CREATE TABLE public.pwned (who text)",
		"GRANT INSERT ON public.pwned TO PUBLIC",
		// format(text, bigint, bigint) is a closer match than
		// pg_catalog.format(text, VARIADIC "any"): it would win if public
		// were on the function's path. The exhausting reserve calls it.
		`CREATE FUNCTION public.format(text, bigint, bigint) RETURNS text LANGUAGE plpgsql AS $$
			BEGIN INSERT INTO public.pwned VALUES (current_user); RETURN 'planted'; END $$`,
		// TEMP tables that would shadow the real ones if pg_temp came first.
		"CREATE TEMP TABLE account (LIKE fanout.account)",
		"CREATE TEMP TABLE reservation (LIKE fanout.reservation)",
		"SET search_path = pg_temp, public, fanout, pg_catalog",
	} {
		if _, err := node.Exec(b.ctx, stmt); err != nil {
			t.Fatalf("attacker setup: %s: %v", stmt, err)
		}
	}
	// Reserve all but 5 tokens: below min_reservation 10, so the run is
	// exhausted in the same statement (ledger_check_exhausted -> format).
	var outcome string
	var amount *int64
	err := node.QueryRow(b.ctx, `SELECT outcome, amount FROM fanout.ledger_reserve($1, 'plant', 'tenant-a', 1, 995, 995, 'n', '1 minute', NULL)`,
		int64(ra.Tasks["t0"])).Scan(&outcome, &amount)
	if err != nil || outcome != "ok" || amount == nil || *amount != 995 {
		t.Fatalf("exhausting reserve as the attacker: outcome %q amount %v err %v; want ok, 995", outcome, amount, err)
	}
	var who []string
	rows, err := b.pool.Query(b.ctx, "SELECT who FROM public.pwned")
	if err != nil {
		t.Fatal(err)
	}
	who, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(who) > 0 {
		t.Errorf("planted functions ran inside the ledger as %v; they must never run there", who)
	}
	acct, err := b.ledger.RunAccount(b.ctx, "plant")
	if err != nil || acct.State != budget.StateExhausted || acct.Reserved != 995 {
		t.Errorf("run account = %+v, %v; want exhausted with 995 reserved (the TEMP tables had no effect)", acct, err)
	}
	var entry string
	if err := b.pool.QueryRow(b.ctx, "SELECT note FROM ledger_entry WHERE kind = 'exhaust' AND run_id = 'plant'").Scan(&entry); err != nil ||
		!strings.HasPrefix(entry, "available 5 < min_reservation 10") {
		t.Errorf("exhaust entry note = %q, %v; want it written by pg_catalog.format", entry, err)
	}
	b.checkConserved(t)
}

// TestSecurityDefinerFunctionsArePinned fails if any SECURITY DEFINER
// function lacks the pinned search_path, or may be executed by PUBLIC or the
// auditor. A function added later without them is caught here.
func TestSecurityDefinerFunctionsArePinned(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rows, err := b.pool.Query(b.ctx, `
		SELECT p.oid::regprocedure::text,
		       coalesce(array_to_string(p.proconfig, ','), ''),
		       p.proacl IS NULL OR EXISTS (SELECT FROM aclexplode(p.proacl) x WHERE x.grantee = 0 AND x.privilege_type = 'EXECUTE'),
		       has_function_privilege('fanout_auditor', p.oid, 'EXECUTE'),
		       has_function_privilege('fanout_app', p.oid, 'EXECUTE') OR has_function_privilege('fanout_worker', p.oid, 'EXECUTE')
		           OR has_function_privilege('fanout_admin', p.oid, 'EXECUTE')
		  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		 WHERE p.prosecdef`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var name, config string
		var public, auditor, app bool
		if err := rows.Scan(&name, &config, &public, &auditor, &app); err != nil {
			t.Fatal(err)
		}
		n++
		if !strings.Contains(config, "search_path=pg_catalog, fanout, pg_temp") {
			t.Errorf("%s: SECURITY DEFINER without search_path = pg_catalog, fanout, pg_temp (config %q)", name, config)
		}
		if public {
			t.Errorf("%s: SECURITY DEFINER executable by PUBLIC", name)
		}
		if auditor {
			t.Errorf("%s: SECURITY DEFINER executable by fanout_auditor", name)
		}
		if !app {
			t.Errorf("%s: SECURITY DEFINER executable by none of the process roles (fanout_app, fanout_worker, fanout_admin)", name)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// The ledger's entry points, at least; "no rows" is a failure, not a pass.
	if n < 9 {
		t.Errorf("found %d SECURITY DEFINER functions; want the 9 ledger entry points at least", n)
	}
	// Nothing else in the schema is executable by PUBLIC either.
	var open []string
	r2, err := b.pool.Query(b.ctx, `
		SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		 WHERE n.nspname = 'fanout' AND (p.proacl IS NULL
		    OR EXISTS (SELECT FROM aclexplode(p.proacl) x WHERE x.grantee = 0 AND x.privilege_type = 'EXECUTE'))`)
	if err != nil {
		t.Fatal(err)
	}
	if open, err = pgx.CollectRows(r2, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(open) > 0 {
		t.Errorf("functions in schema fanout executable by PUBLIC: %v", open)
	}
}
