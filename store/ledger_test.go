package store_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

func TestMain(m *testing.M) {
	if raceChild() || fleetChild() {
		return
	}
	storetest.MigrateFunc = store.Migrate
	storetest.Main(m)
	// Once, after every test: a per-test check would see the goroutines of
	// the other tests running in parallel.
	if err := goleak.Find(); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
		os.Exit(1)
	}
}

type testBundle struct {
	ctx    context.Context
	url    string
	pool   *pgxpool.Pool
	ledger *store.Ledger
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx := t.Context()
	url := storetest.NewDB(t)
	pool, err := store.Open(ctx, url)
	if err != nil {
		t.Fatalf("open pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return &testBundle{ctx: ctx, url: url, pool: pool, ledger: store.NewLedger(pool)}
}

// notifier is a Notifier on the test's database, running until the test
// ends.
func (b *testBundle) notifier(t *testing.T, cfg store.NotifierConfig) *store.Notifier {
	t.Helper()
	n := store.NewNotifier(b.url, cfg)
	storetest.Background(t, n.Run)
	return n
}

// openRun opens a run with the given task limits, named t0, t1, ...
func (b *testBundle) openRun(t *testing.T, runID string, limit, minRes int64, taskLimits ...int64) budget.RunAccounts {
	t.Helper()
	p := budget.OpenRunParams{RunID: runID, TenantID: "tenant-a", Limit: limit, MinReservation: minRes}
	for i, l := range taskLimits {
		p.Tasks = append(p.Tasks, budget.TaskBudget{TaskID: fmt.Sprintf("t%d", i), Limit: l})
	}
	ra, err := b.ledger.OpenRun(b.ctx, p)
	if err != nil {
		t.Fatalf("open run %s: %v", runID, err)
	}
	beginAttempts(t, b.ledger, ra)
	return ra
}

// beginAttempts begins attempt 1 on every account of ra, as the first
// dispatch of each task (and of the run's synthesis) would.
func beginAttempts(t testing.TB, l budget.Ledger, ra budget.RunAccounts) {
	t.Helper()
	ids := []budget.AccountID{ra.Run.ID}
	for _, id := range ra.Tasks {
		ids = append(ids, id)
	}
	for _, id := range ids {
		if a, err := l.Account(context.Background(), id); err != nil || a.Attempt == 1 {
			continue // opened again: begun already
		}
		if n, err := l.BeginAttempt(context.Background(), id, ra.Run.RunID, ra.Run.TenantID); err != nil || n.N != 1 {
			t.Fatalf("begin attempt on account %d: attempt %d, %v", id, n.N, err)
		}
	}
}

// grant fills in p the grant a first dispatch of ra's tasks carries: the
// run, its tenant and attempt 1 (see beginAttempts).
func grant(ra budget.RunAccounts, p budget.ReserveParams) budget.ReserveParams {
	p.RunID, p.TenantID, p.Attempt = ra.Run.RunID, ra.Run.TenantID, 1
	return p
}

func (b *testBundle) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}

// checkConserved asserts I2 on every account: limit = available + reserved +
// spent, the entries sum to the row, and reserved equals what is held. A view
// that returns no rows proves nothing: that is a failure.
func (b *testBundle) checkConserved(t *testing.T) {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT account_id, kind, limit_tokens, reserved_tokens, spent_tokens,
		entries_limit, entries_reserved, entries_spent, conserved FROM conservation_check`)
	if err != nil {
		t.Fatalf("conservation_check: %v", err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var id, lim, res, sp, el, er, es int64
		var kind string
		var ok bool
		if err := rows.Scan(&id, &kind, &lim, &res, &sp, &el, &er, &es, &ok); err != nil {
			t.Fatal(err)
		}
		n++
		if !ok {
			t.Errorf("account %d (%s) not conserved: row limit/reserved/spent %d/%d/%d, entries %d/%d/%d",
				id, kind, lim, res, sp, el, er, es)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Error("conservation_check returned no rows: nothing was checked")
	}
}

const ttl = time.Minute

func TestReserveSettleVoid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "run-1", 1000, 10, 600, 600)
	t0, t1 := ra.Tasks["t0"], ra.Tasks["t1"]

	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: t0, Want: 500, Min: 100, Holder: "n1", TTL: ttl}))
	if err != nil {
		t.Fatalf("reserve: %v", err)
	}
	if r.Amount != 500 || r.Lease.Generation != 1 || r.Lease.Holder != "n1" || r.State != budget.ReservationHeld {
		t.Fatalf("reservation = %+v", r)
	}
	if !r.Lease.ExpiresAt.After(time.Now().Add(ttl / 2)) {
		t.Errorf("lease expires at %v, want about now+%v", r.Lease.ExpiresAt, ttl)
	}
	// The task account caps t1 at 600 but the run has only 500 left: grant 500.
	r2, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: t1, Want: 600, Min: 1, Holder: "n1", TTL: ttl}))
	if err != nil || r2.Amount != 500 {
		t.Fatalf("reserve 2 = %+v, %v; want 500 granted", r2, err)
	}
	// Nothing left: refused with the run named.
	_, err = b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: t0, Want: 10, Min: 1, Holder: "n1", TTL: ttl}))
	var ex *budget.ExhaustedError
	if !errors.As(err, &ex) || ex.Kind != budget.KindRun || !errors.Is(err, budget.ErrExhausted) {
		t.Fatalf("reserve 3 err = %v; want ExhaustedError on the run", err)
	}

	s, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r.ID, Generation: 1, Actual: 320})
	if err != nil || s.Spent != 320 || s.State != budget.ReservationSettled {
		t.Fatalf("settle = %+v, %v", s, err)
	}
	// A retried settle returns the first outcome.
	s2, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r.ID, Generation: 1, Actual: 320})
	if err != nil || s2 != s {
		t.Fatalf("replayed settle = %+v, %v; want %+v", s2, err, s)
	}
	if _, err := b.ledger.Void(b.ctx, r2.ID, 1, ""); err != nil {
		t.Fatalf("void: %v", err)
	}
	run, err := b.ledger.RunAccount(b.ctx, "run-1")
	if err != nil {
		t.Fatal(err)
	}
	if run.Spent != 320 || run.Reserved != 0 || run.Available() != 680 {
		t.Errorf("run account = %+v", run)
	}
	// Refunds do not reopen an exhausted run.
	if run.State != budget.StateExhausted {
		t.Errorf("run state = %s, want exhausted", run.State)
	}
	b.checkConserved(t)
}

func TestOverrunIsRecordedNotHidden(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "run-o", 1000, 1, 1000)
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 100, Min: 100, Holder: "n", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 850, Min: 850, Holder: "n", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	// 100 granted, 250 used: 50 tokens of room are charged, 150 are over every limit.
	s, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r.ID, Generation: 1, Actual: 250})
	if err != nil {
		t.Fatal(err)
	}
	if s.Overrun != 150 || s.Spent != 150 || s.Actual != 250 {
		t.Errorf("settled = %+v; want actual 250, spent 150 (all the room), overrun 150", s)
	}
	if _, err := b.ledger.Void(b.ctx, r2.ID, 1, ""); err != nil {
		t.Fatal(err)
	}
	var overrun int64
	if err := b.pool.QueryRow(b.ctx, "SELECT overrun_tokens FROM run_spend WHERE run_id = 'run-o'").Scan(&overrun); err != nil {
		t.Fatal(err)
	}
	if overrun != 150 {
		t.Errorf("run_spend.overrun_tokens = %d, want 150", overrun)
	}
	b.checkConserved(t)
}

func TestTenantAccountCapsItsRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ten, err := b.ledger.OpenTenant(b.ctx, "tenant-a", 300)
	if err != nil {
		t.Fatal(err)
	}
	ra, err := b.ledger.OpenRun(b.ctx, budget.OpenRunParams{RunID: "r", TenantID: "tenant-a", TenantAccount: ten.ID,
		Limit: 1000, MinReservation: 1, Tasks: []budget.TaskBudget{{TaskID: "x", Limit: 1000}}})
	if err != nil {
		t.Fatal(err)
	}
	beginAttempts(t, b.ledger, ra)
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["x"], Want: 1000, Min: 1, Holder: "n", TTL: ttl}))
	if err != nil || r.Amount != 300 {
		t.Fatalf("reserve = %+v, %v; want 300 granted (the tenant's limit)", r, err)
	}
	_, err = b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["x"], Want: 1, Min: 1, Holder: "n", TTL: ttl}))
	var ex *budget.ExhaustedError
	if !errors.As(err, &ex) || ex.Kind != budget.KindTenant {
		t.Fatalf("err = %v; want the tenant account exhausted", err)
	}
	b.checkConserved(t)
}

func TestOpenRunIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.openRun(t, "same", 100, 1, 10, 20)
	second := b.openRun(t, "same", 100, 1, 10, 20)
	if first.Run.ID != second.Run.ID || first.Tasks["t1"] != second.Tasks["t1"] {
		t.Fatalf("second open = %+v, want %+v", second, first)
	}
	if n := b.count(t, "account"); n != 3 {
		t.Errorf("accounts = %d, want 3", n)
	}
}

func TestReserveKeyIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "k", 1000, 1, 1000)
	p := grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 100, Min: 1, Holder: "n", TTL: ttl, Key: "k/t0/1"})
	var wg sync.WaitGroup
	got := make([]budget.Reservation, 8)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := b.ledger.Reserve(b.ctx, p)
			if err != nil {
				t.Errorf("reserve: %v", err)
			}
			got[i] = r
		}()
	}
	wg.Wait()
	for _, r := range got {
		if r.ID != got[0].ID {
			t.Fatalf("same key gave reservations %d and %d", got[0].ID, r.ID)
		}
	}
	if n := b.count(t, "reservation"); n != 1 {
		t.Errorf("reservations = %d, want 1", n)
	}
	b.checkConserved(t)
}

// TestBadInput: each bad call returns its typed error and writes nothing.
func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "bad", 1000, 1, 1000)
	acct := ra.Tasks["t0"]
	settled, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: acct, Want: 100, Min: 1, Holder: "n", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: settled.ID, Generation: 1, Actual: 40}); err != nil {
		t.Fatal(err)
	}
	closed := b.openRun(t, "closed", 1000, 1, 1000)
	if _, err := b.ledger.CloseRun(b.ctx, "closed"); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name  string
		call  func() error
		want  error
		field string
	}{
		{"zero want", func() error {
			_, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: acct, Want: 0, Min: 0, Holder: "n", TTL: ttl}))
			return err
		}, budget.ErrInvalid, "want"},
		{"negative want", func() error {
			_, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: acct, Want: -5, Min: 1, Holder: "n", TTL: ttl}))
			return err
		}, budget.ErrInvalid, "want"},
		{"min above want", func() error {
			_, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: acct, Want: 5, Min: 6, Holder: "n", TTL: ttl}))
			return err
		}, budget.ErrInvalid, "min"},
		{"no holder", func() error {
			_, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: acct, Want: 5, Min: 1, TTL: ttl}))
			return err
		}, budget.ErrInvalid, "holder"},
		{"no ttl", func() error {
			_, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: acct, Want: 5, Min: 1, Holder: "n"}))
			return err
		}, budget.ErrInvalid, "ttl"},
		{"a lease over an hour", func() error {
			_, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: acct, Want: 5, Min: 1, Holder: "n", TTL: 61 * time.Minute}))
			return err
		}, budget.ErrInvalid, "ttl"},
		{"negative actual", func() error {
			_, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: settled.ID, Generation: 1, Actual: -1})
			return err
		}, budget.ErrInvalid, "actual"},
		{"unknown account", func() error {
			_, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: 999999, Want: 5, Min: 1, Holder: "n", TTL: ttl}))
			return err
		}, budget.ErrNotFound, ""},
		{"unknown reservation", func() error {
			_, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: 999999, Generation: 1, Actual: 1})
			return err
		}, budget.ErrNotFound, ""},
		{"unknown run", func() error {
			_, err := b.ledger.RunAccount(b.ctx, "nope")
			return err
		}, budget.ErrNotFound, ""},
		{"settle twice, other amount", func() error {
			_, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: settled.ID, Generation: 1, Actual: 41})
			return err
		}, budget.ErrConflict, ""},
		{"void a settled reservation", func() error {
			_, err := b.ledger.Void(b.ctx, settled.ID, 1, "")
			return err
		}, budget.ErrConflict, ""},
		{"reserve on a closed run", func() error {
			_, err := b.ledger.Reserve(b.ctx, grant(closed, budget.ReserveParams{Account: closed.Tasks["t0"], Want: 5, Min: 1, Holder: "n", TTL: ttl}))
			return err
		}, budget.ErrExhausted, ""},
		{"open run with zero limit", func() error {
			_, err := b.ledger.OpenRun(b.ctx, budget.OpenRunParams{RunID: "z", TenantID: "x", Limit: 0, MinReservation: 1})
			return err
		}, budget.ErrInvalid, "limit"},
		{"open run with duplicate tasks", func() error {
			_, err := b.ledger.OpenRun(b.ctx, budget.OpenRunParams{RunID: "z", TenantID: "x", Limit: 10, MinReservation: 1,
				Tasks: []budget.TaskBudget{{TaskID: "a", Limit: 1}, {TaskID: "a", Limit: 1}}})
			return err
		}, budget.ErrInvalid, "tasks[1].task_id"},
		{"open run under a missing tenant account", func() error {
			_, err := b.ledger.OpenRun(b.ctx, budget.OpenRunParams{RunID: "z", TenantID: "x", TenantAccount: 424242, Limit: 10, MinReservation: 1})
			return err
		}, budget.ErrNotFound, ""},
	}
	for _, tc := range cases {
		before := b.count(t, "ledger_entry") + b.count(t, "reservation") + b.count(t, "account")
		err := tc.call()
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
			continue
		}
		var ve *budget.ValidationError
		if tc.field != "" && (!errors.As(err, &ve) || ve.Field != tc.field) {
			t.Errorf("%s: err = %v, want it to name field %q", tc.name, err, tc.field)
		}
		if after := b.count(t, "ledger_entry") + b.count(t, "reservation") + b.count(t, "account"); after != before {
			t.Errorf("%s: wrote %d rows, want none", tc.name, after-before)
		}
	}
	b.checkConserved(t)
}

// TestLedgerEntryIsAppendOnly: UPDATE, DELETE and TRUNCATE of ledger_entry
// fail as the app role, as the auditor, and even as the owner (trigger).
func TestLedgerEntryIsAppendOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.openRun(t, "tamper", 100, 1, 100)
	for _, role := range []string{"fanout_app", "fanout_auditor", ""} {
		for _, stmt := range []string{
			"UPDATE ledger_entry SET delta_limit = 0",
			"DELETE FROM ledger_entry",
			"TRUNCATE ledger_entry",
		} {
			conn, err := b.pool.Acquire(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if role != "" {
				if _, err := conn.Exec(b.ctx, "SET ROLE "+role); err != nil {
					t.Fatal(err)
				}
			}
			_, err = conn.Exec(b.ctx, stmt)
			conn.Exec(b.ctx, "RESET ROLE") //nolint:errcheck // the connection is released right after
			conn.Release()
			if err == nil {
				t.Errorf("%q as %q succeeded, want refused", stmt, role)
			} else if !strings.Contains(err.Error(), "permission denied") && !strings.Contains(err.Error(), "append-only") {
				t.Errorf("%q as %q: err = %v, want a permission or append-only refusal", stmt, role, err)
			}
		}
	}
	if n := b.count(t, "ledger_entry"); n != 2 {
		t.Errorf("ledger_entry rows = %d, want the 2 open entries untouched", n)
	}
}

// TestAuditorSeesViewsOnly: the auditor reads every view and no table.
func TestAuditorSeesViewsOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.openRun(t, "audit", 100, 1, 100)
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(b.ctx, "SET ROLE fanout_auditor"); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(context.WithoutCancel(b.ctx), "RESET ROLE") //nolint:errcheck // the connection is released right after
	for _, v := range []string{"run_spend", "task_spend", "tenant_spend_daily", "open_reservations", "conservation_check", "audit_ledger_entry", "task_outcome"} {
		if _, err := conn.Exec(b.ctx, "SELECT * FROM "+v+" WHERE tenant_id = 'tenant-a'"); err != nil {
			t.Errorf("auditor cannot read %s: %v", v, err)
		}
	}
	// The views run with the auditor's privileges (security_invoker, for
	// row-level security: migration 0021), so it may read the columns
	// they show; never one no view shows.
	for _, col := range []string{"run.spec", "run.result", "task.outcome", "run_event.event",
		"api_key.secret_sha256"} {
		table, column, _ := strings.Cut(col, ".")
		if _, err := conn.Exec(b.ctx, "SELECT "+column+" FROM "+table); err == nil {
			t.Errorf("auditor can read %s, which no view shows", col)
		}
	}
	if _, err := conn.Exec(b.ctx, "SELECT ledger_reserve(1, 1, 1, 'x', '1s', NULL)"); err == nil {
		t.Errorf("auditor can call ledger_reserve")
	}
}

// TestNoticeSurvivesListenerLoss: exhaust a run while the listener's backend
// has been killed; the subscriber still hears it through the poll.
func TestNoticeSurvivesListenerLoss(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "notice", 1000, 100, 1000)
	const poll = 300 * time.Millisecond
	// The listener stays away for the whole test once killed.
	n := b.notifier(t, store.NotifierConfig{MinBackoff: time.Minute, MaxBackoff: time.Minute})
	w := budget.NewWatcher(store.NewWatchSource(b.pool, n), budget.WatcherConfig{PollInterval: poll})
	ctx, cancel := context.WithCancel(b.ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); w.Run(ctx) }() //nolint:errcheck // returns ctx.Err() when the test ends it
	defer func() { cancel(); wg.Wait() }()
	sub := w.Subscribe("notice")
	defer sub.Close()

	// Wait for the listener to be up, then kill its backend.
	var killed bool
	deadline := time.Now().Add(10 * time.Second)
	for !killed && time.Now().Before(deadline) {
		err := b.pool.QueryRow(b.ctx, `SELECT coalesce(bool_or(pg_terminate_backend(pid)), false)
			FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`,
			store.ListenerApplicationName).Scan(&killed)
		if err != nil {
			t.Fatal(err)
		}
		if !killed {
			time.Sleep(20 * time.Millisecond) // polling pg_stat_activity
		}
	}
	if !killed {
		t.Fatal("listener connection never appeared in pg_stat_activity")
	}
	if _, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 950, Min: 950, Holder: "n", TTL: ttl})); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	select {
	case <-sub.Done():
	case <-time.After(poll + 5*time.Second):
		t.Fatalf("no exhaustion signal %v after the exhausting commit", time.Since(start))
	}
	if sig := sub.Signal(); sig.State != budget.StateExhausted || !errors.Is(sig.Err(), budget.ErrExhausted) {
		t.Errorf("signal = %+v, want exhausted", sig)
	}
}

// TestNoticeIsHeardOnce: the notice path delivers a cancel, and a second
// subscriber after the fact is told at once.
func TestNoticeIsHeardOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.openRun(t, "cancel-me", 1000, 1, 1000)
	w := budget.NewWatcher(store.NewWatchSource(b.pool, b.notifier(t, store.NotifierConfig{})), budget.WatcherConfig{PollInterval: time.Hour})
	ctx, cancel := context.WithCancel(b.ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); w.Run(ctx) }() //nolint:errcheck // returns ctx.Err() when the test ends it
	defer func() { cancel(); wg.Wait() }()
	sub := w.Subscribe("cancel-me")
	defer sub.Close()
	// The poll runs hourly, so only LISTEN can deliver; retry the cancel
	// until the listener is up (a notice before LISTEN is lost, by design).
	deadline := time.Now().Add(10 * time.Second)
	for {
		var listening bool
		b.pool.QueryRow(b.ctx, `SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name = $1
			AND datname = current_database() AND state = 'idle'`, store.ListenerApplicationName).Scan(&listening) //nolint:errcheck // a failed read leaves false and the poll goes on
		if listening || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling pg_stat_activity
	}
	if _, err := b.ledger.CancelRun(b.ctx, "cancel-me", "user asked"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("cancel notice never arrived")
	}
	if sub.Signal().State != budget.StateCancelled {
		t.Errorf("signal = %+v", sub.Signal())
	}
	late := w.Subscribe("cancel-me")
	defer late.Close()
	select {
	case <-late.Done():
	default:
		t.Error("a subscriber after the signal was not told at once")
	}
	// Cancelling again changes nothing and the account stays cancelled.
	a, err := b.ledger.CancelRun(b.ctx, "cancel-me", "again")
	if err != nil || a.State != budget.StateCancelled || a.Cause != "user asked" {
		t.Errorf("second cancel = %+v, %v", a, err)
	}
}

// TestConservationCheckReportsTampering is the positive control of I2:
// conservation_check must report exactly the account whose row or journal
// was changed behind the ledger's back (here by the owner, who can).
func TestConservationCheckReportsTampering(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "tamper-c", 1000, 1, 500, 500)
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 100, Min: 1, Holder: "n", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r.ID, Generation: 1, Actual: 70}); err != nil {
		t.Fatal(err)
	}
	b.checkConserved(t) // the control's control: honest changes are conserved
	broken := func() map[budget.AccountID]bool {
		t.Helper()
		rows, err := b.pool.Query(b.ctx, "SELECT account_id FROM conservation_check WHERE NOT conserved")
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		out := map[budget.AccountID]bool{}
		for _, id := range ids {
			out[budget.AccountID(id)] = true
		}
		return out
	}
	// A balance rewritten without an entry.
	if _, err := b.pool.Exec(b.ctx, "UPDATE account SET spent = spent - 30 WHERE account_id = $1", int64(ra.Tasks["t0"])); err != nil {
		t.Fatal(err)
	}
	if got := broken(); len(got) != 1 || !got[ra.Tasks["t0"]] {
		t.Errorf("after rewriting task t0's spend: not conserved = %v, want exactly account %d", got, ra.Tasks["t0"])
	}
	if _, err := b.pool.Exec(b.ctx, "UPDATE account SET spent = spent + 30 WHERE account_id = $1", int64(ra.Tasks["t0"])); err != nil {
		t.Fatal(err)
	}
	if got := broken(); len(got) != 0 {
		t.Fatalf("after restoring it: not conserved = %v, want none", got)
	}
	// An entry with no balance change behind it.
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, kind, delta_spent)
		VALUES ('tenant-a', 'tamper-c', 't1', $1, ARRAY[$1::bigint], 'settle', 5)`, int64(ra.Tasks["t1"])); err != nil {
		t.Fatal(err)
	}
	if got := broken(); len(got) != 1 || !got[ra.Tasks["t1"]] {
		t.Errorf("after a forged entry on task t1: not conserved = %v, want exactly account %d", got, ra.Tasks["t1"])
	}
}

// TestCancelAfterExhaustion: a run exhausted under DRAIN still has calls in
// flight, so a CancelRun must still reach it: the ledger moves the exhausted
// run to cancelled with the caller's cause, posts one cancel entry and
// notifies, and a watcher hears the cancel after the exhaustion, through
// the notice and through the poll. A closed run stays closed.
func TestCancelAfterExhaustion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "drained", 1000, 100, 1000)
	src := store.NewWatchSource(b.pool, b.notifier(t, store.NotifierConfig{}))
	heard := budget.NewWatcher(src, budget.WatcherConfig{PollInterval: time.Hour}) // notices only
	ctx, cancel := context.WithCancel(b.ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); heard.Run(ctx) }() //nolint:errcheck // returns ctx.Err() when the test ends it
	defer func() { cancel(); wg.Wait() }()
	polled := budget.NewWatcher(src, budget.WatcherConfig{}) // never Run: it learns only when polled
	bySub, byPoll := heard.Subscribe("drained"), polled.Subscribe("drained")
	defer bySub.Close()
	defer byPoll.Close()
	awaitListener(t, b)

	res, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 950, Min: 950, Holder: "n", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	if err := polled.Poll(b.ctx); err != nil {
		t.Fatal(err)
	}
	for who, s := range map[string]*budget.Subscription{"notice": bySub, "poll": byPoll} {
		select {
		case <-s.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no exhaustion signal", who)
		}
		if sig := s.Signal(); sig.State != budget.StateExhausted {
			t.Fatalf("%s: first signal %+v, want exhausted", who, sig)
		}
		select {
		case <-s.Cancelled():
			t.Fatalf("%s: cancelled before anyone cancelled the run: %+v", who, s.CancelSignal())
		default:
		}
	}

	a, err := b.ledger.CancelRun(b.ctx, "drained", "cancelled by caller: stop")
	if err != nil || a.State != budget.StateCancelled || a.Cause != "cancelled by caller: stop" {
		t.Fatalf("cancel of the exhausted run = %+v, %v; want cancelled with the caller's cause", a, err)
	}
	if err := polled.Poll(b.ctx); err != nil {
		t.Fatal(err)
	}
	for who, s := range map[string]*budget.Subscription{"notice": bySub, "poll": byPoll} {
		select {
		case <-s.Cancelled():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the cancel after exhaustion was not heard", who)
		}
		if sig := s.CancelSignal(); sig.State != budget.StateCancelled || !errors.Is(sig.Err(), budget.ErrRunCancelled) {
			t.Errorf("%s: cancel signal %+v, want cancelled", who, sig)
		}
		if sig := s.Signal(); sig.State != budget.StateExhausted {
			t.Errorf("%s: the first signal became %+v; it stays the exhaustion", who, sig)
		}
	}
	if sig := byPoll.CancelSignal(); sig.Cause != "cancelled by caller: stop" {
		t.Errorf("the poll's cancel signal has cause %q, want the caller's", sig.Cause)
	}

	// Once cancelled, a cancel changes nothing; the held call settles.
	if a, err := b.ledger.CancelRun(b.ctx, "drained", "again"); err != nil || a.Cause != "cancelled by caller: stop" {
		t.Errorf("second cancel = %+v, %v", a, err)
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: res.ID, Generation: res.Lease.Generation, Actual: 900}); err != nil {
		t.Fatalf("settle the call in flight after the cancel: %v", err)
	}
	if a, err := b.ledger.CloseRun(b.ctx, "drained"); err != nil || a.State != budget.StateClosed {
		t.Fatalf("close = %+v, %v", a, err)
	}
	if a, err := b.ledger.CancelRun(b.ctx, "drained", "too late"); err != nil || a.State != budget.StateClosed {
		t.Errorf("cancel of a closed run = %+v, %v; want it closed", a, err)
	}
	var cancels []string
	if err := b.pool.QueryRow(b.ctx, `SELECT coalesce(array_agg(note ORDER BY entry_id), '{}') FROM ledger_entry
		WHERE run_id = 'drained' AND kind = 'cancel'`).Scan(&cancels); err != nil {
		t.Fatal(err)
	}
	if len(cancels) != 1 || cancels[0] != "cancelled by caller: stop" {
		t.Errorf("cancel entries %q, want one with the caller's cause", cancels)
	}
	b.checkConserved(t)
}

// awaitListener waits until a watcher's LISTEN connection is idle on the
// test's database: a notice sent before it listens is lost, by design.
func awaitListener(t *testing.T, b *testBundle) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var listening bool
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name = $1
			AND datname = current_database() AND state = 'idle'`, store.ListenerApplicationName).Scan(&listening); err != nil {
			t.Fatal(err)
		}
		if listening {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the watcher's listener never appeared in pg_stat_activity")
		}
		time.Sleep(10 * time.Millisecond) // polling pg_stat_activity
	}
}
