package store_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fanout/fanout/store/storetest"
)

// processProbe is one thing a process might do in the database: sql is run
// with $1 = the session's own actor ("role:LOGIN"), in a transaction that
// is always rolled back. Arguments are chosen so that a role allowed to
// run it gets past the privilege check (and usually fails on its input).
type processProbe struct {
	name string
	sql  string
	// who may: any of "worker", "orchestrator", "admin".
	who []string
}

// processRoleProbes lists what each process's role may do and, by omission,
// what it may not: every function a node calls and every table write.
func processRoleProbes() []processProbe {
	const (
		w, o, a = "worker", "orchestrator", "admin"
	)
	return []processProbe{
		// The ledger calls of a dispatched task (and the synthesis, on the orchestrator).
		{"ledger_reserve", `SELECT fanout.ledger_reserve(0, '', '', 0, 0, 0, '', interval '1 second', '', '')`, []string{w, o}},
		{"ledger_reserve_batch", `SELECT fanout.ledger_reserve_batch('{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}')`, []string{w, o}},
		{"ledger_settle", `SELECT fanout.ledger_settle(0, 0, 0, false)`, []string{w, o}},
		{"ledger_void", `SELECT fanout.ledger_void(0, 0, '')`, []string{w, o}},
		{"ledger_renew", `SELECT fanout.ledger_renew(0, 0, interval '1 second')`, []string{w, o}},
		{"ledger_expire", `SELECT fanout.ledger_expire(0)`, []string{w, o}},
		{"semaphore_acquire", `SELECT fanout.semaphore_acquire(0, 'probe', ARRAY['probe'], ARRAY[1], interval '1 second')`, []string{w, o}},
		{"semaphore_release", `SELECT fanout.semaphore_release(0, 'probe', interval '0')`, []string{w, o}},
		{"semaphore_renew", `SELECT fanout.semaphore_renew(0, 'probe', interval '1 second')`, []string{w, o}},
		{"rate_capacity", `SELECT fanout.rate_capacity(1, interval '1 second')`, []string{w, o}},
		{"tool_call_issue", `SELECT fanout.tool_call_issue(0, '', '', '', '', 0, 0, 0, '', '', '', '')`, []string{w, o}},
		{"tool_call_send", `SELECT fanout.tool_call_send(0, '', '', '', '', 0)`, []string{w, o}},
		{"tool_call_expire", `SELECT fanout.tool_call_expire('')`, []string{w, o}},
		{"tool_call_status", `SELECT fanout.tool_call_status('')`, []string{w, o}},
		{"tool_call_resolve", `SELECT fanout.tool_call_resolve('', 'done', '', '')`, []string{w, o}},
		{"tool_call_writes", `SELECT fanout.tool_call_writes('', '', '') WHERE false`, []string{w, o}},
		{"tool_cache_get", `SELECT fanout.tool_cache_get(0, 'probe', '', '', '', '', 'probe', '')`, []string{w, o}},
		{"tool_cache_put", `SELECT fanout.tool_cache_put(0, 'probe', '', '', '', '', 'probe', '', '{}', 1)`, []string{w, o}},
		{"read the result cache", `SELECT result FROM fanout.tool_result_cache LIMIT 0`, nil},
		{"read a tool call's result", `SELECT result FROM fanout.tool_call LIMIT 0`, []string{o}},
		{"rate bucket", `INSERT INTO fanout.rate_bucket (key) SELECT 'probe' WHERE false`, []string{w, o, a}},
		{"learn a provider's rate limits", `INSERT INTO fanout.provider_limit (bucket) SELECT 'probe' WHERE false`, []string{w, o}},
		{"read the providers' rate limits", `SELECT limit_requests FROM fanout.provider_limit LIMIT 0`, []string{w, o}},
		// The orchestrator's: runs, attempts, events, key lookups.
		{"ledger_open_run", `SELECT fanout.ledger_open_run('', '', NULL, 0, 0, '{}', '{}')`, []string{o}},
		{"ledger_begin_attempt", `SELECT fanout.ledger_begin_attempt(0, '', '')`, []string{o}},
		{"ledger_begin_attempts", `SELECT fanout.ledger_begin_attempts('{}', '', '')`, []string{o}},
		{"ledger_continue_run", `SELECT fanout.ledger_continue_run('', '', '', 0, 0, '{}', '', '', '', 0)`, []string{o}},
		{"read a run's continuations", `SELECT added_tokens FROM fanout.run_continuation LIMIT 0`, []string{o}},
		{"ledger_end_run", `SELECT fanout.ledger_end_run('', '', '')`, []string{o}},
		{"ledger_end_run_fenced", `SELECT fanout.ledger_end_run_fenced('', '', '', 0)`, []string{o}},
		{"insert a run", `INSERT INTO fanout.run (run_id) SELECT 'probe' WHERE false`, []string{o}},
		{"update a task", `UPDATE fanout.task SET status = status WHERE false`, []string{o}},
		{"append an event", `INSERT INTO fanout.run_event (run_id) SELECT 'probe' WHERE false`, []string{o}},
		{"read specs", `SELECT spec FROM fanout.run LIMIT 0`, []string{o}},
		{"record a run's tool policy", `INSERT INTO fanout.run_tool_policy (run_id) SELECT 'probe' WHERE false`, []string{o}},
		{"tool_call_decide", `SELECT fanout.tool_call_decide('', '', 'approved', $1, '')`, []string{o}},
		{"tool_call_end_run", `SELECT fanout.tool_call_end_run('')`, []string{o}},
		{"read key digests", `SELECT secret_sha256 FROM fanout.api_key LIMIT 0`, []string{o, a}},
		// AdminService's: keys, tenants, quotas, budgets, prices.
		{"admin_create_tenant", `SELECT fanout.admin_create_tenant($1, '', NULL, NULL, NULL, NULL)`, []string{a}},
		{"admin_set_quotas", `SELECT fanout.admin_set_quotas($1, '', NULL, NULL, NULL, NULL)`, []string{a}},
		{"admin_create_key", `SELECT fanout.admin_create_key($1, '', NULL, '', '{}', '\x00', 0, NULL)`, []string{a}},
		{"admin_revoke_key", `SELECT fanout.admin_revoke_key($1, '')`, []string{a}},
		{"ledger_open_tenant", `SELECT fanout.ledger_open_tenant('', 0)`, []string{a}},
		{"ledger_set_tenant_budget", `SELECT fanout.ledger_set_tenant_budget($1, '', 0, 'none', NULL)`, []string{a}},
		{"price_set", `SELECT fanout.price_set($1, '', now(), -1, 0)`, []string{a}},
		{"read the admin log", `SELECT actor FROM fanout.admin_action LIMIT 0`, []string{a}},
		// Nobody's: the ledger outside its functions.
		{"write an account", `UPDATE fanout.account SET spent = spent WHERE false`, nil},
		{"write an entry", `INSERT INTO fanout.ledger_entry (tenant_id) SELECT 'probe' WHERE false`, nil},
		{"write a reservation", `UPDATE fanout.reservation SET amount = amount WHERE false`, nil},
		{"write a key", `UPDATE fanout.api_key SET name = name WHERE false`, nil},
		{"write a tool call's outcome", `UPDATE fanout.tool_call SET state = state WHERE false`, nil},
		{"write the result cache directly", `INSERT INTO fanout.tool_result_cache (tenant_id) SELECT 'probe' WHERE false`, nil},
		{"record a decision directly", `INSERT INTO fanout.tool_call_decision (call_id) SELECT 'probe' WHERE false`, nil},
	}
}

// TestEachRoleMayDoOnlyItsOwn (issue 23, the role split): logged in as a
// worker, an orchestrator and AdminService each (members of fanout_worker,
// fanout_app and fanout_admin only), every probe is tried: the role's own
// get past the privilege check, every other one is refused
// insufficient_privilege. A compromised worker cannot open runs, begin
// attempts, mint keys or set budgets; an orchestrator cannot either of the
// last two.
func TestEachRoleMayDoOnlyItsOwn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logins := map[string]string{
		"worker":       storetest.WorkerURL(t, b.url),
		"orchestrator": storetest.NodeURL(t, b.url),
		"admin":        storetest.AdminURL(t, b.url),
	}
	roles := make([]string, 0, len(logins))
	for r := range logins {
		roles = append(roles, r)
	}
	sort.Strings(roles)
	for _, role := range roles {
		conn, err := pgx.Connect(b.ctx, logins[role])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		actor := storetest.Actor(t, conn)
		for _, p := range processRoleProbes() {
			may := false
			for _, w := range p.who {
				may = may || w == role
			}
			code := tryRolledBack(b.ctx, conn, p.sql, actor)
			refused := code == "42501"
			switch {
			case may && refused:
				t.Errorf("%s may %s, but was refused insufficient_privilege", role, p.name)
			case !may && !refused:
				t.Errorf("%s may not %s, but got past the privilege check (SQLSTATE %q)", role, p.name, code)
			}
		}
	}
}

// tryRolledBack runs sql with arg in a transaction it rolls back, and
// returns the SQLSTATE it failed with ("" if it did not).
func tryRolledBack(ctx context.Context, conn *pgx.Conn, sql, arg string) string {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return "begin: " + err.Error()
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // always rolled back
	args := []any{}
	if strings.Contains(sql, "$1") {
		args = append(args, arg)
	}
	_, err = tx.Exec(ctx, sql, args...)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	if err != nil {
		return fmt.Sprintf("not a PostgreSQL error: %v", err)
	}
	return ""
}
