package store_test

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// TestWorkerActsOnlyOnTheAttemptsDispatchedToIt (issue 23, from its
// review): a worker's login could read any account's attempt number and any
// reservation's generation, and with them reserve on, settle, void or renew
// another tenant's task, and read or resolve its tool calls. Now each of
// these asks a worker's login for the attempt's secret, which only the
// dispatch carries: with it the worker does its work; with none, or the
// secret of another attempt, it is refused and nothing is written. An
// orchestrator's login is not asked (it begins attempts).
func TestWorkerActsOnlyOnTheAttemptsDispatchedToIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, err := store.OpenPool(b.ctx, storetest.WorkerURL(t, b.url), store.PoolConfig{MaxConns: 2})
	if err != nil {
		t.Fatalf("open a worker's pool: %v", err)
	}
	t.Cleanup(pool.Close)
	worker := store.NewLedger(pool)
	writes := store.NewToolCalls(pool, store.ToolCallsConfig{Logger: slog.New(slog.DiscardHandler)})

	ts := openTasks(t, b) // acme/r1/t1, acme/r1/t2, globex/g1/t1, each at attempt 1
	mine, err := b.ledger.BeginAttempt(b.ctx, ts["acme/r1/t1"], "r1", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if mine.N != 2 || len(mine.Secret) < 32 {
		t.Fatalf("begin attempt = %d with a %d-byte secret; want attempt 2 with a secret of at least 32 bytes", mine.N, len(mine.Secret))
	}
	theirs, err := b.ledger.BeginAttempt(b.ctx, ts["globex/g1/t1"], "g1", "globex")
	if err != nil {
		t.Fatal(err)
	}
	if theirs.Secret == mine.Secret {
		t.Fatalf("two attempts got the same secret %q", mine.Secret)
	}
	reserve := func(acct budget.AccountID, run, tenant string, a budget.Attempt, secret, key string) (budget.Reservation, error) {
		return worker.Reserve(b.ctx, budget.ReserveParams{Account: acct, RunID: run, TenantID: tenant, Attempt: a.N,
			Secret: secret, Want: 10, Min: 1, Holder: "w", TTL: time.Minute, Key: key})
	}
	before := b.count(t, "reservation")
	for _, tc := range []struct{ name, secret string }{
		{"no secret", ""},
		{"another attempt's secret", mine.Secret},
		{"a made-up secret", "00000000000000000000000000000000"},
	} {
		if _, err := reserve(ts["globex/g1/t1"], "g1", "globex", theirs, tc.secret, "steal"); !errors.Is(err, budget.ErrDenied) {
			t.Errorf("a worker reserves on globex's task with %s: %v; want ErrDenied", tc.name, err)
		}
	}
	if got := b.count(t, "reservation"); got != before {
		t.Fatalf("refused reserves wrote %d reservations", got-before)
	}

	// Globex's worker reserves with its own secret; ours cannot touch it.
	held, err := reserve(ts["globex/g1/t1"], "g1", "globex", theirs, theirs.Secret, "k")
	if err != nil {
		t.Fatalf("globex's worker reserves with its attempt's secret: %v", err)
	}
	for _, secret := range []string{"", mine.Secret} {
		if _, err := worker.Settle(b.ctx, budget.SettleParams{Reservation: held.ID, Generation: held.Lease.Generation,
			Secret: secret, Actual: 0}); !errors.Is(err, budget.ErrDenied) {
			t.Errorf("settle globex's reservation at 0 with secret %q: %v; want ErrDenied", secret, err)
		}
		if _, err := worker.Void(b.ctx, held.ID, held.Lease.Generation, secret); !errors.Is(err, budget.ErrDenied) {
			t.Errorf("void globex's reservation with secret %q: %v; want ErrDenied", secret, err)
		}
		if _, err := worker.Renew(b.ctx, held.ID, held.Lease.Generation, time.Hour, secret); !errors.Is(err, budget.ErrDenied) {
			t.Errorf("renew globex's reservation with secret %q: %v; want ErrDenied", secret, err)
		}
	}
	var state string
	var expires time.Time
	if err := b.pool.QueryRow(b.ctx, `SELECT state, lease_expires_at FROM fanout.reservation WHERE reservation_id = $1`,
		int64(held.ID)).Scan(&state, &expires); err != nil {
		t.Fatal(err)
	}
	if state != "held" || !expires.Equal(held.Lease.ExpiresAt) {
		t.Fatalf("globex's reservation is %s until %s after the refused calls; want held until %s", state, expires, held.Lease.ExpiresAt)
	}
	if _, err := worker.Renew(b.ctx, held.ID, held.Lease.Generation, time.Minute, theirs.Secret); err != nil {
		t.Errorf("renew with its own secret: %v", err)
	}
	if _, err := worker.Settle(b.ctx, budget.SettleParams{Reservation: held.ID, Generation: held.Lease.Generation,
		Secret: theirs.Secret, Actual: 7}); err != nil {
		t.Errorf("settle with its own secret: %v", err)
	}

	// Tool calls: issued, resolved and read with the attempt's secret only.
	w := ts.at(write("r1/t1/a2/i1/c0", 2, 1, 0, `{"title":"x"}`))
	if _, err := writes.IssueWrite(b.ctx, w, theirs.Secret); !errors.Is(err, store.ErrWriteConflict) {
		t.Errorf("issue acme's write with globex's secret: %v; want ErrWriteConflict", err)
	}
	if _, err := writes.IssueWrite(b.ctx, w, mine.Secret); err != nil {
		t.Fatalf("issue with the attempt's secret: %v", err)
	}
	// Globex's worker cannot take the key of acme's next call under its own
	// task (with its own secret): the key must be its own call's.
	squat := ts.at(write("r1/t1/a2/i1/c1", 2, 1, 1, `{}`))
	squat.TenantID, squat.RunID, squat.TaskID, squat.Account = "globex", "g1", "t1", int64(ts["globex/g1/t1"])
	if _, err := writes.IssueWrite(b.ctx, squat, theirs.Secret); !errors.Is(err, store.ErrWriteConflict) {
		t.Errorf("globex's worker issues acme's next key under its own task: %v; want ErrWriteConflict", err)
	}
	if _, err := writes.IssueWrite(b.ctx, w, ""); !errors.Is(err, store.ErrWriteConflict) {
		t.Errorf("issue again without the secret: %v; want ErrWriteConflict", err)
	}
	if err := writes.ResolveWrite(b.ctx, w.Key, theirs.Secret, runs.WriteDone, "forged", ""); !errors.Is(err, store.ErrWriteConflict) {
		t.Errorf("resolve acme's write with globex's secret: %v; want ErrWriteConflict", err)
	}
	if err := writes.ResolveWrite(b.ctx, w.Key, mine.Secret, runs.WriteDone, "ticket 7", ""); err != nil {
		t.Fatalf("resolve with the attempt's secret: %v", err)
	}
	if _, err := writes.Writes(b.ctx, "acme", "r1", "t1", theirs.Secret); err == nil {
		t.Errorf("globex's worker read acme's task's writes")
	}
	got, err := writes.Writes(b.ctx, "acme", "r1", "t1", mine.Secret)
	if err != nil || len(got) != 1 || got[0].Result != "ticket 7" {
		t.Fatalf("read the task's writes with its secret: %+v, %v; want the one write, done with \"ticket 7\"", got, err)
	}

	// Of the table itself a worker reads no result, and writes nothing.
	conn, err := pgx.Connect(b.ctx, storetest.WorkerURL(t, b.url))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(b.ctx) //nolint:errcheck // test connection
	for _, sql := range []string{
		`SELECT result FROM fanout.tool_call`,
		`UPDATE fanout.tool_call SET result = 'forged'`,
	} {
		if code := tryRolledBack(b.ctx, conn, sql, ""); code != "42501" {
			t.Errorf("a worker's %q: SQLSTATE %q; want 42501 (insufficient_privilege)", sql, code)
		}
	}
}

// TestWorkerCannotTouchAKeysRequestBucket (issue 23, from its review): the
// request buckets of API keys ("key:<id>") are the orchestrators'; a
// worker's login sees none and can write none, so it can neither drain a
// key's requests nor lift a tenant's rate. Its providers' buckets it keeps.
func TestWorkerCannotTouchAKeysRequestBucket(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO fanout.rate_bucket (bucket, rpm, tpm, burst) VALUES
		('key:fk_victim', 1, 0, '1 minute')`); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(b.ctx, storetest.WorkerURL(t, b.url))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(b.ctx) //nolint:errcheck // test connection
	exec := func(sql string) (int64, error) {
		tag, err := conn.Exec(b.ctx, sql)
		return tag.RowsAffected(), err
	}
	if n, err := exec(`UPDATE fanout.rate_bucket SET rpm = 1000000, requests = 1000000 WHERE bucket = 'key:fk_victim'`); err != nil || n != 0 {
		t.Errorf("a worker updates a key's bucket: %d rows, %v; want 0 rows", n, err)
	}
	if _, err := exec(`INSERT INTO fanout.rate_bucket (bucket, rpm, tpm, burst) VALUES ('key:fk_new', 1000000, 0, '1 minute')`); err == nil {
		t.Errorf("a worker defined a key's bucket")
	}
	if _, err := exec(`INSERT INTO fanout.rate_bucket (bucket, rpm, tpm, burst) VALUES ('openai:0123456789ab', 60, 1000, '1 minute')`); err != nil {
		t.Errorf("a worker defines its provider's bucket: %v", err)
	}
	if _, err := exec(`UPDATE fanout.rate_bucket SET bucket = 'key:fk_renamed' WHERE bucket = 'openai:0123456789ab'`); err == nil {
		t.Errorf("a worker renamed its provider's bucket into a key's")
	}
	var rpm int64
	if err := b.pool.QueryRow(b.ctx, `SELECT rpm FROM fanout.rate_bucket WHERE bucket = 'key:fk_victim'`).Scan(&rpm); err != nil || rpm != 1 {
		t.Errorf("the key's bucket has rpm %d (%v) after the worker's tries; want 1", rpm, err)
	}
}

// TestWorkerWithoutTheSecretLocksNothing (issue 23, from its review): the
// functions took their row locks before they asked for the secret, so a
// worker's login could call them in a transaction it kept open and freeze
// another tenant's accounts. Each call below is refused (or finds nothing
// to do) inside a transaction left open, and the rows it would have locked
// can still be locked at once (NOWAIT) by another session.
func TestWorkerWithoutTheSecretLocksNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ts := openTasks(t, b)
	victim, err := b.ledger.BeginAttempt(b.ctx, ts["globex/g1/t1"], "g1", "globex")
	if err != nil {
		t.Fatal(err)
	}
	held, err := b.ledger.Reserve(b.ctx, budget.ReserveParams{Account: ts["globex/g1/t1"], RunID: "g1", TenantID: "globex",
		Attempt: victim.N, Secret: victim.Secret, Want: 10, Min: 1, Holder: "w", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	mustIssue(t, nodeToolCalls(t, b), ts, runs.Write{Key: "g1/t1/a2/i1/c0", TenantID: "globex", RunID: "g1", TaskID: "t1",
		Attempt: 2, Iteration: 1, Server: "crm", Tool: "crm__create_ticket", ArgsDigest: digest("{}")})
	worker, err := pgx.Connect(b.ctx, storetest.WorkerURL(t, b.url))
	if err != nil {
		t.Fatal(err)
	}
	defer worker.Close(b.ctx) //nolint:errcheck // test connection
	for _, c := range []struct{ name, sql string }{
		{"reserve", fmt.Sprintf(`SELECT outcome FROM fanout.ledger_reserve(%d, 'g1', 'globex', 2, 10, 1, 'w', '1 minute', 'k', NULL, 'wrong')`, ts["globex/g1/t1"])},
		{"settle", fmt.Sprintf(`SELECT outcome FROM fanout.ledger_settle(%d, 1, 0, false, NULL, 0, 0, 'wrong')`, held.ID)},
		{"void", fmt.Sprintf(`SELECT outcome FROM fanout.ledger_void(%d, 1, '', 'wrong')`, held.ID)},
		{"expire a live lease", fmt.Sprintf(`SELECT outcome FROM fanout.ledger_expire(%d)`, held.ID)},
		{"issue", fmt.Sprintf(`SELECT fanout.tool_call_issue(%d, 'g1/t1/a2/i1/c1', 'globex', 'g1', 't1', 2, 1, 1, 'crm', 'x', repeat('0', 64), 'wrong')`, ts["globex/g1/t1"])},
		{"resolve", `SELECT state FROM fanout.tool_call_resolve('g1/t1/a2/i1/c0', 'done', 'forged', '', 'wrong')`},
	} {
		t.Run(c.name, func(t *testing.T) {
			tx, err := worker.Begin(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(b.ctx) //nolint:errcheck // left open on purpose until the end
			var outcome *string
			if err := tx.QueryRow(b.ctx, c.sql).Scan(&outcome); err != nil {
				t.Fatalf("%s as a worker without the secret: %v", c.name, err)
			}
			if outcome != nil && *outcome != "denied" && *outcome != "replay" {
				t.Errorf("%s as a worker without the secret: %q; want denied (or, for a live lease, replay)", c.name, *outcome)
			}
			for _, lock := range []string{
				fmt.Sprintf(`SELECT 1 FROM fanout.account WHERE account_id = ANY ('%s'::bigint[]) FOR UPDATE NOWAIT`, chainOf(t, b, ts["globex/g1/t1"])),
				fmt.Sprintf(`SELECT 1 FROM fanout.reservation WHERE reservation_id = %d FOR UPDATE NOWAIT`, held.ID),
				`SELECT 1 FROM fanout.tool_call WHERE key = 'g1/t1/a2/i1/c0' FOR UPDATE NOWAIT`,
			} {
				if _, err := b.pool.Exec(b.ctx, lock); err != nil {
					t.Errorf("after the worker's %s (its transaction open): %s: %v; want the row free", c.name, lock, err)
				}
			}
		})
	}
}

// chainOf is the account chain of acct (task, run, tenant), as a SQL array literal.
func chainOf(t *testing.T, b *testBundle, acct budget.AccountID) string {
	t.Helper()
	var chain string
	if err := b.pool.QueryRow(b.ctx, `SELECT chain::text FROM fanout.account WHERE account_id = $1`, int64(acct)).Scan(&chain); err != nil {
		t.Fatal(err)
	}
	return chain
}

// TestWorkerCannotTakeATenantsTaskSlots (issue 23, from its review): the
// orchestrators' cap of a tenant's tasks in flight is a semaphore in the
// same table as the providers' limits; a worker's login could fill another
// tenant's slots, or release and renew an orchestrator's lease (its id and
// holder were readable). Now a worker's login takes, releases and renews
// no tenant-tasks slot, and reads no lease id or holder; its own keys work.
func TestWorkerCannotTakeATenantsTaskSlots(t *testing.T) {
	t.Parallel()
	b := setup(t)
	orch := store.NewSemaphore(b.pool, store.SemaphoreConfig{})
	lease, err := orch.Acquire(b.ctx, "orchestrator-1", []store.SlotRequest{{Key: "tenant-tasks:globex", Limit: 2}}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	worker, err := pgx.Connect(b.ctx, storetest.WorkerURL(t, b.url))
	if err != nil {
		t.Fatal(err)
	}
	defer worker.Close(b.ctx) //nolint:errcheck // test connection
	if code := tryRolledBack(b.ctx, worker, `SELECT fanout.semaphore_acquire(99, 'w', ARRAY['tenant-tasks:globex'], ARRAY[2], '1 hour')`, ""); code != "42501" {
		t.Errorf("a worker takes a tenant's task slot: SQLSTATE %q; want 42501", code)
	}
	for _, sql := range []string{
		fmt.Sprintf(`SELECT fanout.semaphore_release(%d, 'orchestrator-1', '0')`, lease.ID),
		fmt.Sprintf(`SELECT fanout.semaphore_renew(%d, 'orchestrator-1', '1 hour')`, lease.ID),
	} {
		var n int
		if err := worker.QueryRow(b.ctx, sql).Scan(&n); err != nil || n != 0 {
			t.Errorf("a worker's %s: %d slots, %v; want 0", sql, n, err)
		}
	}
	var taken int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM fanout.semaphore_slot WHERE key = 'tenant-tasks:globex'
		AND lease_id = $1 AND expires_at > now() AND expires_at < now() + interval '2 minutes'`, lease.ID).Scan(&taken); err != nil || taken != 1 {
		t.Errorf("the orchestrator's slot after the worker's tries: %d held as it was, %v; want 1", taken, err)
	}
	if code := tryRolledBack(b.ctx, worker, `SELECT lease_id, holder FROM fanout.semaphore_slot`, ""); code != "42501" {
		t.Errorf("a worker reads lease ids and holders: SQLSTATE %q; want 42501", code)
	}
	if code := tryRolledBack(b.ctx, worker, `SELECT fanout.semaphore_acquire(99, 'w', ARRAY['mcp:crm'], ARRAY[2], '1 minute')`, ""); code != "" {
		t.Errorf("a worker takes its tool's slot: SQLSTATE %q; want it granted", code)
	}
}
