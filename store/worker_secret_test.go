package store_test

import (
	"errors"
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
	if err := writes.IssueWrite(b.ctx, w, theirs.Secret); !errors.Is(err, store.ErrWriteConflict) {
		t.Errorf("issue acme's write with globex's secret: %v; want ErrWriteConflict", err)
	}
	if err := writes.IssueWrite(b.ctx, w, mine.Secret); err != nil {
		t.Fatalf("issue with the attempt's secret: %v", err)
	}
	if err := writes.IssueWrite(b.ctx, w, ""); !errors.Is(err, store.ErrWriteConflict) {
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
