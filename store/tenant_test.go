package store_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/tenant"
)

// patience bounds every wait in the tenant tests.
const patience = 15 * time.Second

// openTenantRun opens run runID of tenant under its tenant account, with
// one task "x" as large as the run, and begins attempt 1 on both.
func (b *testBundle) openTenantRun(t *testing.T, ten budget.TenantAccount, runID string, limit, minRes int64) budget.RunAccounts {
	t.Helper()
	ra, err := b.ledger.OpenRun(b.ctx, budget.OpenRunParams{RunID: runID, TenantID: ten.TenantID, TenantAccount: ten.ID,
		Limit: limit, MinReservation: minRes, Tasks: []budget.TaskBudget{{TaskID: "x", Limit: limit}}})
	if err != nil {
		t.Fatalf("open run %s under tenant %s: %v", runID, ten.TenantID, err)
	}
	beginAttempts(t, b.ledger, ra)
	return ra
}

func (b *testBundle) setBudget(t *testing.T, tb budget.TenantBudget) budget.TenantAccount {
	t.Helper()
	if tb.Actor == "" {
		tb.Actor = storetest.Actor(t, b.pool)
	}
	ten, err := b.ledger.SetTenantBudget(b.ctx, tb)
	if err != nil {
		t.Fatalf("set budget %+v: %v", tb, err)
	}
	return ten
}

func (b *testBundle) entries(t *testing.T, where string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM ledger_entry WHERE "+where, args...).Scan(&n); err != nil {
		t.Fatalf("count entries where %s: %v", where, err)
	}
	return n
}

// TestTenantPeriodRollsOver: a tenant budget of 1,000 tokens every 2 s,
// with a reservation held and a run in flight across the boundary. The
// first reserve after the period's end posts exactly one 'period' entry
// (limit = spent + period limit) and is granted from the new period;
// TenantAccount reports the new period before anything is written; every
// account, the tenant's included, stays conserved; tenant_period_spend
// splits the spend at the boundary, the held reservation's settle counting
// in the new period.
func TestTenantPeriodRollsOver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ten := b.setBudget(t, budget.TenantBudget{TenantID: "acme", Limit: 1000,
		Period: budget.Period{Kind: budget.PeriodEvery, Every: 2 * time.Second}})
	if ten.Limit != 1000 || ten.PeriodLimit != 1000 || ten.Period.Every != 2*time.Second || ten.PeriodEnd.IsZero() {
		t.Fatalf("tenant account = %+v; want limit 1000 per 2s with an end", ten)
	}
	ra := b.openTenantRun(t, ten, "roll", 100_000, 1)
	x := ra.Tasks["x"]
	held, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: x, Want: 300, Min: 300, Holder: "n", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	used, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: x, Want: 600, Min: 600, Holder: "n", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: used.ID, Generation: 1, Actual: 600}); err != nil {
		t.Fatal(err)
	}
	// 100 left in this period: a reserve of 500 cannot be granted now.
	if _, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: x, Want: 500, Min: 500, Holder: "n", TTL: ttl})); !errors.Is(err, budget.ErrExhausted) {
		t.Fatalf("reserve of 500 with 100 left: err = %v, want ErrExhausted", err)
	}

	// Wait, in database time, for the period's end.
	deadline := time.Now().Add(patience)
	for {
		var passed bool
		if err := b.pool.QueryRow(b.ctx, "SELECT now() >= period_end FROM account WHERE account_id = $1", int64(ten.ID)).Scan(&passed); err != nil {
			t.Fatal(err)
		}
		if passed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the period did not end within %v", patience)
		}
		time.Sleep(50 * time.Millisecond) // polling the database clock
	}
	// Read as of now: rolled over, though nothing was written yet.
	now, err := b.ledger.TenantAccount(b.ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if now.Limit != 1600 || now.PeriodSpent != 0 || !now.PeriodEnd.After(ten.PeriodEnd) || now.Available() != 700 {
		t.Errorf("TenantAccount after the end = %+v; want limit 600+1000, period spent 0, an end after %v, 1000 - 300 held = 700 available", now, ten.PeriodEnd)
	}
	if n := b.entries(t, "kind = 'period'"); n != 0 {
		t.Errorf("TenantAccount wrote %d period entries; want it to only read", n)
	}

	// The run, still in flight, reserves from the new period.
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: x, Want: 500, Min: 500, Holder: "n", TTL: ttl}))
	if err != nil {
		t.Fatalf("reserve after the period's end: %v; want it granted from the new period", err)
	}
	if n := b.entries(t, "kind = 'period' AND account_id = $1", int64(ten.ID)); n != 1 {
		t.Errorf("period entries = %d, want 1", n)
	}
	var delta int64
	if err := b.pool.QueryRow(b.ctx, "SELECT delta_limit FROM ledger_entry WHERE kind = 'period'").Scan(&delta); err != nil || delta != 600 {
		t.Errorf("period entry delta_limit = %d, %v; want 600 (limit 1000 -> spent 600 + 1000)", delta, err)
	}
	// The held reservation settles in the new period (estimated), the new one reported.
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: held.ID, Generation: 1, Actual: 200, Estimated: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r.ID, Generation: 1, Actual: 500}); err != nil {
		t.Fatal(err)
	}
	if a, err := b.ledger.RunAccount(b.ctx, "roll"); err != nil || a.State != budget.StateOpen {
		t.Errorf("run = %+v, %v; want it open across the boundary", a, err)
	}
	got, err := b.ledger.TenantAccount(b.ctx, "acme")
	if err != nil || got.Limit != 1600 || got.Spent != 1300 || got.PeriodSpent != 700 || got.Reserved != 0 {
		t.Errorf("tenant after = %+v, %v; want limit 1600, spent 1300, 700 of it this period", got, err)
	}
	b.checkConserved(t)
	var tenantRows int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FILTER (WHERE conserved) FROM conservation_check WHERE kind = 'tenant' AND account_id = $1",
		int64(ten.ID)).Scan(&tenantRows); err != nil || tenantRows != 1 {
		t.Errorf("conservation_check rows of the tenant account conserved = %d, %v; want 1", tenantRows, err)
	}

	type period struct {
		Spent, Reported, Estimated int64
		Start                      time.Time
		End                        *time.Time
	}
	rows, err := b.pool.Query(b.ctx, `SELECT spent_tokens, reported_tokens, estimated_tokens, period_start, period_end
		FROM tenant_period_spend WHERE tenant_id = 'acme' ORDER BY period_start`)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (period, error) {
		var p period
		return p, row.Scan(&p.Spent, &p.Reported, &p.Estimated, &p.Start, &p.End)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 {
		t.Fatalf("tenant_period_spend = %+v; want 2 periods", ps)
	}
	if p := ps[0]; p.Spent != 600 || p.Reported != 600 || p.Estimated != 0 || p.End == nil || !p.End.Equal(ten.PeriodEnd) {
		t.Errorf("first period = %+v; want 600 reported, ending at %v", p, ten.PeriodEnd)
	}
	if p := ps[1]; p.Spent != 700 || p.Reported != 500 || p.Estimated != 200 || p.Start.Before(ten.PeriodEnd) {
		t.Errorf("second period = %+v; want 700 spent (500 reported, 200 estimated), starting at or after %v", p, ten.PeriodEnd)
	}
}

// notices collects the fanout_run_state notices on its own connection.
type notices struct {
	conn *pgx.Conn
}

func listenNotices(t *testing.T, b *testBundle) *notices {
	t.Helper()
	cfg, err := pgx.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(b.ctx, "LISTEN fanout_run_state"); err != nil {
		t.Fatal(err)
	}
	return &notices{conn: conn}
}

// until sends a sentinel notice and returns every notice that came before
// it: all notices committed before the call, and nothing later.
func (n *notices) until(t *testing.T, b *testBundle) []string {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, "SELECT pg_notify('fanout_run_state', 'sentinel -')"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.ctx, patience)
	defer cancel()
	var out []string
	for {
		m, err := n.conn.WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("wait for notices (%d so far: %v): %v", len(out), out, err)
		}
		if m.Payload == "sentinel -" {
			return out
		}
		out = append(out, m.Payload)
	}
}

// TestTenantExhaustionEndsEveryRun: two runs of tenant acme under a tenant
// budget of 10,000 tokens reserve concurrently until refused, while a third
// makes no call. The grants never add up past the tenant's limit; the
// statement that leaves the tenant below its min_reservation marks all
// three runs exhausted with cause
// "tenant budget exhausted" and notifies each once; no reserve is granted
// after that commit; a watcher hears the cause on the notice path and the
// poll path; a run of tenant globex is unaffected; every account is
// conserved.
func TestTenantExhaustionEndsEveryRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	acme := b.setBudget(t, budget.TenantBudget{TenantID: "acme", Limit: 10_000, MinReservation: 100,
		Period: budget.Period{Kind: budget.PeriodNone}})
	globex := b.setBudget(t, budget.TenantBudget{TenantID: "globex", Limit: 10_000, Period: budget.Period{Kind: budget.PeriodDay}})
	runs := []budget.RunAccounts{
		b.openTenantRun(t, acme, "acme-1", 1_000_000, 100),
		b.openTenantRun(t, acme, "acme-2", 1_000_000, 100),
	}
	// A run of acme that makes no call: it ends with the others.
	idle := b.openTenantRun(t, acme, "acme-idle", 1_000_000, 100)
	other := b.openTenantRun(t, globex, "globex-1", 1_000_000, 100)
	listen := listenNotices(t, b)

	// A watcher on the notice path only (its poll is hourly), listening
	// before anything is exhausted.
	w := budget.NewWatcher(store.NewWatchSource(b.pool, b.notifier(t, store.NotifierConfig{})), budget.WatcherConfig{PollInterval: time.Hour})
	ctx, cancel := context.WithCancel(b.ctx)
	var wwg sync.WaitGroup
	wwg.Add(1)
	go func() { defer wwg.Done(); w.Run(ctx) }() //nolint:errcheck // returns ctx.Err() when the test ends it
	defer func() { cancel(); wwg.Wait() }()
	sub := w.Subscribe("acme-1")
	defer sub.Close()
	deadline := time.Now().Add(patience)
	for {
		var listening bool
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name = $1
			AND datname = current_database() AND state = 'idle'`, store.ListenerApplicationName).Scan(&listening); err != nil {
			t.Fatal(err)
		}
		if listening {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the watcher's listener did not connect within %v", patience)
		}
		time.Sleep(10 * time.Millisecond) // polling pg_stat_activity
	}

	var mu sync.Mutex
	var granted int64
	var wg sync.WaitGroup
	for i := range 8 {
		ra := runs[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["x"], Want: 700, Min: 100,
					Holder: "n", TTL: ttl, Key: fmt.Sprintf("g%d-%d", i, k)}))
				if errors.Is(err, budget.ErrExhausted) {
					return
				}
				if err != nil {
					t.Errorf("reserve: %v", err)
					return
				}
				mu.Lock()
				granted += r.Amount
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if granted > 10_000 || granted <= 10_000-100 {
		t.Errorf("granted %d in all; want at most the tenant's 10000 and within its min_reservation of it", granted)
	}
	for _, ra := range append(runs, idle) {
		a, err := b.ledger.RunAccount(b.ctx, ra.Run.RunID)
		if err != nil || a.State != budget.StateExhausted || a.Cause != budget.CauseTenantExhausted {
			t.Errorf("run %s = %+v, %v; want exhausted with cause %q", ra.Run.RunID, a, err, budget.CauseTenantExhausted)
		}
		if _, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["x"], Want: 1, Min: 1, Holder: "n", TTL: ttl})); !errors.Is(err, budget.ErrExhausted) {
			t.Errorf("reserve on %s after the exhausting commit: err = %v, want ErrExhausted", ra.Run.RunID, err)
		}
	}
	// No grant after the exhausting commit: every entry of the tenant is
	// written under its lock, so entry ids order them as the commits did.
	var after int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM ledger_entry WHERE tenant_id = 'acme' AND kind = 'reserve'
		AND entry_id > (SELECT min(entry_id) FROM ledger_entry WHERE tenant_id = 'acme' AND kind = 'exhaust')`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != 0 {
		t.Errorf("%d reserves granted after the exhausting commit", after)
	}
	if n := b.entries(t, "kind = 'exhaust' AND tenant_id = 'acme'"); n != 3 {
		t.Errorf("exhaust entries of acme = %d, want one per run", n)
	}
	got := map[string]int{}
	for _, p := range listen.until(t, b) {
		got[p]++
	}
	if got["exhausted acme-1"] != 1 || got["exhausted acme-2"] != 1 || got["exhausted acme-idle"] != 1 || len(got) != 3 {
		t.Errorf("notices = %v; want exactly one 'exhausted' per run of acme", got)
	}

	select {
	case <-sub.Done():
	case <-time.After(patience):
		t.Fatalf("the watcher heard nothing of acme-1 within %v", patience)
	}
	if sig := sub.Signal(); sig.State != budget.StateExhausted || sig.Cause != budget.CauseTenantExhausted {
		t.Errorf("notice path signal = %+v; want exhausted with cause %q", sig, budget.CauseTenantExhausted)
	}
	polled := budget.NewWatcher(store.NewWatchSource(b.pool, b.notifier(t, store.NotifierConfig{})), budget.WatcherConfig{})
	ps := polled.Subscribe("acme-2")
	defer ps.Close()
	if err := polled.Poll(b.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ps.Done():
		if sig := ps.Signal(); sig.State != budget.StateExhausted || sig.Cause != budget.CauseTenantExhausted {
			t.Errorf("poll path signal = %+v; want exhausted with cause %q", sig, budget.CauseTenantExhausted)
		}
	default:
		t.Error("the poll did not report acme-2 exhausted")
	}

	if a, err := b.ledger.RunAccount(b.ctx, "globex-1"); err != nil || a.State != budget.StateOpen {
		t.Errorf("globex's run = %+v, %v; want it open", a, err)
	}
	if _, err := b.ledger.Reserve(b.ctx, grant(other, budget.ReserveParams{Account: other.Tasks["x"], Want: 700, Min: 700, Holder: "n", TTL: ttl})); err != nil {
		t.Errorf("globex's reserve: %v; want it granted", err)
	}
	b.checkConserved(t)
}

// TestTenantExhaustedByOverrun: a settle whose overrun leaves the tenant
// below its min_reservation exhausts every open run of the tenant, not
// only the one that settled; a run opened later is exhausted by its first
// refused reserve.
func TestTenantExhaustedByOverrun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ten := b.setBudget(t, budget.TenantBudget{TenantID: "acme", Limit: 1000, MinReservation: 100})
	r1 := b.openTenantRun(t, ten, "o-1", 100_000, 10)
	b.openTenantRun(t, ten, "o-2", 100_000, 10)
	res, err := b.ledger.Reserve(b.ctx, grant(r1, budget.ReserveParams{Account: r1.Tasks["x"], Want: 500, Min: 500, Holder: "n", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"o-1", "o-2"} {
		if a, _ := b.ledger.RunAccount(b.ctx, id); a.State != budget.StateOpen {
			t.Fatalf("run %s = %+v before the overrun; want open", id, a)
		}
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: res.ID, Generation: 1, Actual: 950}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"o-1", "o-2"} {
		if a, err := b.ledger.RunAccount(b.ctx, id); err != nil || a.State != budget.StateExhausted || a.Cause != budget.CauseTenantExhausted {
			t.Errorf("run %s = %+v, %v; want exhausted by its tenant", id, a, err)
		}
	}
	late := b.openTenantRun(t, ten, "o-3", 100_000, 10)
	_, err = b.ledger.Reserve(b.ctx, grant(late, budget.ReserveParams{Account: late.Tasks["x"], Want: 60, Min: 60, Holder: "n", TTL: ttl}))
	var ex *budget.ExhaustedError
	if !errors.As(err, &ex) || ex.Kind != budget.KindTenant || ex.Account != ten.ID {
		t.Errorf("reserve of a run opened after = %v; want the tenant account named", err)
	}
	if a, err := b.ledger.RunAccount(b.ctx, "o-3"); err != nil || a.State != budget.StateExhausted || a.Cause != budget.CauseTenantExhausted {
		t.Errorf("run o-3 = %+v, %v; want exhausted by its tenant's refusal", a, err)
	}
	b.checkConserved(t)
}

// TestSetTenantBudgetIsLogged: every budget change is one admin_action
// row (who, what, which tenant, the arguments) in the transaction that
// made it, readable by the auditor; a change posts an 'adjust' entry with
// the change of limit; a limit below what is spent and held is clamped
// (nothing more granted) and exhausts the tenant's runs; bad input writes
// nothing and names the field.
func TestSetTenantBudgetIsLogged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The first change is made by a live admin key, which presents its
	// secret (as AdminService does for its caller).
	digest := sha256.Sum256([]byte("admin-secret"))
	keys := store.NewKeys(b.pool, nil)
	if _, err := keys.CreateKey(b.ctx, tenant.CreateKeyParams{Actor: storetest.Actor(t, b.pool),
		KeyID: "fk_0123456789abcdef", Scopes: []string{"admin"}, SecretSHA256: digest[:]}); err != nil {
		t.Fatal(err)
	}
	if _, err := keys.CreateTenant(b.ctx, storetest.Actor(t, b.pool), "acme", tenant.Quotas{}); err != nil {
		t.Fatal(err)
	}
	if _, err := keys.WithActorSecret("admin-secret").UpdateTenant(b.ctx, tenant.UpdateTenantParams{Actor: "key:fk_0123456789abcdef",
		TenantID: "acme", Budget: &budget.TenantBudget{Limit: 5000, Period: budget.Period{Kind: budget.PeriodMonth}}}); err != nil {
		t.Fatal(err)
	}
	ten, err := b.ledger.TenantAccount(b.ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if ten.Period.Kind != budget.PeriodMonth || ten.PeriodEnd.Day() != 1 || ten.PeriodEnd.Hour() != 0 || ten.PeriodEnd.Location() == nil {
		t.Errorf("monthly budget = %+v; want it to end on the 1st at midnight UTC", ten)
	}
	if end := ten.PeriodEnd.UTC(); end.Day() != 1 || end.Hour() != 0 || end.Minute() != 0 {
		t.Errorf("period end %v; want midnight UTC on the 1st", end)
	}
	ra := b.openTenantRun(t, ten, "adj", 100_000, 10)
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["x"], Want: 1500, Min: 1500, Holder: "n", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r.ID, Generation: 1, Actual: 1000}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["x"], Want: 400, Min: 400, Holder: "n", TTL: ttl})); err != nil {
		t.Fatal(err)
	}
	// Lowered under spent + held (1000 + 400): clamped, and the tenant is exhausted.
	low := b.setBudget(t, budget.TenantBudget{TenantID: "acme", Limit: 1200, Actor: storetest.Actor(t, b.pool),
		Period: budget.Period{Kind: budget.PeriodMonth}})
	if low.Limit != 1400 || low.Available() != 0 || low.PeriodLimit != 1200 {
		t.Errorf("lowered budget = %+v; want limit clamped to spent + reserved = 1400", low)
	}
	if a, err := b.ledger.RunAccount(b.ctx, "adj"); err != nil || a.State != budget.StateExhausted || a.Cause != budget.CauseTenantExhausted {
		t.Errorf("run = %+v, %v; want exhausted by the lowered budget", a, err)
	}
	var deltas []int64
	rows, err := b.pool.Query(b.ctx, "SELECT delta_limit FROM ledger_entry WHERE account_id = $1 AND kind = 'adjust' ORDER BY entry_id", int64(ten.ID))
	if err != nil {
		t.Fatal(err)
	}
	if deltas, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil || len(deltas) != 1 || deltas[0] != -3600 {
		t.Errorf("adjust entries = %v, %v; want one of -3600 (5000 -> 1400)", deltas, err)
	}

	type action struct {
		Actor, Action, Tenant string
		Limit                 int64
		Period                string
	}
	readLog := func() []action {
		t.Helper()
		var out []action
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(b.ctx, "SET LOCAL ROLE fanout_auditor"); err != nil {
				return err
			}
			rows, err := tx.Query(b.ctx, `SELECT actor, action, tenant_id, (detail->>'limit')::bigint, detail->>'period'
				FROM admin_audit WHERE action = 'tenant.set_budget' ORDER BY action_id`)
			if err != nil {
				return err
			}
			out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (action, error) {
				var a action
				return a, row.Scan(&a.Actor, &a.Action, &a.Tenant, &a.Limit, &a.Period)
			})
			return err
		})
		if err != nil {
			t.Fatalf("read admin_audit as fanout_auditor: %v", err)
		}
		return out
	}
	want := []action{
		{"key:fk_0123456789abcdef", "tenant.set_budget", "acme", 5000, "month"},
		{storetest.Actor(t, b.pool), "tenant.set_budget", "acme", 1200, "month"},
	}
	if got := readLog(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("admin_audit = %+v\nwant %+v", got, want)
	}

	bad := []struct {
		b     budget.TenantBudget
		field string
	}{
		{budget.TenantBudget{TenantID: "acme", Limit: 0, Actor: "a", Period: budget.Period{Kind: budget.PeriodDay}}, "limit"},
		{budget.TenantBudget{TenantID: "acme", Limit: 10, Actor: "", Period: budget.Period{Kind: budget.PeriodDay}}, "actor"},
		{budget.TenantBudget{TenantID: "", Limit: 10, Actor: "a", Period: budget.Period{Kind: budget.PeriodDay}}, "tenant_id"},
		{budget.TenantBudget{TenantID: "acme", Limit: 10, Actor: "a", Period: budget.Period{Kind: budget.PeriodEvery, Every: time.Millisecond}}, "period.every"},
		{budget.TenantBudget{TenantID: "acme", Limit: 10, Actor: "a", Period: budget.Period{Kind: "week"}}, "period.kind"},
		{budget.TenantBudget{TenantID: "acme", Limit: 10, Actor: "a", MinReservation: 11}, "min_reservation"},
	}
	entries := b.count(t, "ledger_entry")
	for _, c := range bad {
		_, err := b.ledger.SetTenantBudget(b.ctx, c.b)
		var ve *budget.ValidationError
		if !errors.As(err, &ve) || ve.Field != c.field {
			t.Errorf("SetTenantBudget(%+v) = %v; want a validation error on %s", c.b, err, c.field)
		}
	}
	if got := readLog(); len(got) != 2 {
		t.Errorf("admin_audit has %d rows after refused changes; want 2", len(got))
	}
	if n := b.count(t, "ledger_entry"); n != entries {
		t.Errorf("refused changes wrote %d entries", n-entries)
	}
	if _, err := b.ledger.TenantAccount(b.ctx, "nobody"); !errors.Is(err, budget.ErrNotFound) {
		t.Errorf("TenantAccount of a tenant with no budget: err = %v, want ErrNotFound", err)
	}
	// OpenTenant still opens a budget of its limit in all.
	o, err := b.ledger.OpenTenant(b.ctx, "initech", 700)
	if err != nil || o.Limit != 700 {
		t.Fatalf("OpenTenant = %+v, %v", o, err)
	}
	if ta, err := b.ledger.TenantAccount(b.ctx, "initech"); err != nil || ta.Period.Kind != budget.PeriodNone || ta.PeriodLimit != 700 || !ta.PeriodEnd.IsZero() {
		t.Errorf("TenantAccount of an OpenTenant account = %+v, %v; want period none of 700", ta, err)
	}
	if strings.Contains(fmt.Sprint(readLog()), "initech") {
		t.Error("OpenTenant (a node's call) was logged as an admin action")
	}
	b.checkConserved(t)
}

// TestTenantBelowItsMinimumGrantsNothing: once a tenant's budget is below
// its min_reservation, the ledger itself grants nothing more under it —
// not only admission, which refuses new runs: a run opened under the
// tenant anyway (a node with the node role may call ledger_open_run) is
// refused even a reserve whose own minimum would fit in what is left, and
// is ended by its tenant.
func TestTenantBelowItsMinimumGrantsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ten := b.setBudget(t, budget.TenantBudget{TenantID: "acme", Limit: 1000, MinReservation: 100})
	first := b.openTenantRun(t, ten, "m-1", 100_000, 10)
	if _, err := b.ledger.Reserve(b.ctx, grant(first, budget.ReserveParams{Account: first.Tasks["x"], Want: 950, Min: 950, Holder: "n", TTL: ttl})); err != nil {
		t.Fatal(err)
	}
	// 50 tokens are left, below the tenant's minimum of 100.
	late := b.openTenantRun(t, ten, "m-2", 100_000, 10)
	_, err := b.ledger.Reserve(b.ctx, grant(late, budget.ReserveParams{Account: late.Tasks["x"], Want: 40, Min: 10, Holder: "n", TTL: ttl}))
	var ex *budget.ExhaustedError
	if !errors.As(err, &ex) || ex.Kind != budget.KindTenant || ex.Account != ten.ID {
		t.Fatalf("reserve of 40 (min 10) with 50 left under a tenant whose minimum is 100 = %v; want refused, naming the tenant account", err)
	}
	if a, err := b.ledger.Account(b.ctx, ten.ID); err != nil || a.Reserved != 950 || a.Spent != 0 {
		t.Errorf("tenant account after the refusal = %+v, %v; want 950 reserved as before, nothing more", a, err)
	}
	if a, err := b.ledger.RunAccount(b.ctx, "m-2"); err != nil || a.State != budget.StateExhausted || a.Cause != budget.CauseTenantExhausted {
		t.Errorf("run m-2 = %+v, %v; want exhausted by its tenant", a, err)
	}
	b.checkConserved(t)
}
