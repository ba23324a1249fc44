package store_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
)

// TestLeaseExpiry: an abandoned reservation is posted as estimated spend
// within TTL + sweep interval of database time, and its old holder is fenced.
func TestLeaseExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "lease", 1000, 1, 1000)
	const leaseTTL, interval = 500 * time.Millisecond, 100 * time.Millisecond
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 200, Min: 1, Holder: "gone", TTL: leaseTTL}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); budget.Sweep(ctx, b.ledger, interval, nil) }()
	defer func() { cancel(); wg.Wait() }()

	var state string
	var lateness time.Duration
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		err := b.pool.QueryRow(b.ctx, `SELECT state, coalesce(resolved_at - lease_expires_at, '0')
			FROM reservation WHERE reservation_id = $1`, int64(r.ID)).Scan(&state, &lateness)
		if err != nil {
			t.Fatal(err)
		}
		if state != "held" {
			break
		}
		time.Sleep(20 * time.Millisecond) // polling the database, not synchronizing goroutines
	}
	if state != "expired" {
		t.Fatalf("reservation state = %s, want expired", state)
	}
	// DB time: resolved no later than one sweep interval after the lease ended
	// (plus scheduling slack on a shared machine).
	if lateness > interval+time.Second {
		t.Errorf("expired %v after the lease ended, want within the sweep interval %v", lateness, interval)
	}
	run, _ := b.ledger.RunAccount(b.ctx, "lease")
	if run.Spent != 200 || run.Reserved != 0 {
		t.Errorf("run = %+v; want the 200 reserved counted as spent", run)
	}
	var estimated int64
	b.pool.QueryRow(b.ctx, "SELECT estimated_tokens FROM run_spend WHERE run_id = 'lease'").Scan(&estimated) //nolint:errcheck // a failed read leaves 0, which the assertion reports
	if estimated != 200 {
		t.Errorf("run_spend.estimated_tokens = %d, want 200", estimated)
	}
	_, err = b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r.ID, Generation: r.Lease.Generation, Actual: 10})
	if !errors.Is(err, budget.ErrLeaseLost) {
		t.Errorf("settle under the old generation: err = %v, want ErrLeaseLost", err)
	}
	if _, err := b.ledger.Renew(b.ctx, r.ID, r.Lease.Generation, time.Minute, ""); !errors.Is(err, budget.ErrLeaseLost) {
		t.Errorf("renew after expiry: err = %v, want ErrLeaseLost", err)
	}
	b.checkConserved(t)
}

func TestRenewExtendsLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "renew", 1000, 1, 1000)
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 10, Min: 1, Holder: "n", TTL: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b.ledger.Renew(b.ctx, r.ID, 1, time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	if !r2.Lease.ExpiresAt.After(r.Lease.ExpiresAt.Add(30 * time.Minute)) {
		t.Errorf("renewed lease ends %v, want about an hour after %v", r2.Lease.ExpiresAt, r.Lease.ExpiresAt)
	}
	if _, err := b.ledger.Renew(b.ctx, r.ID, 7, time.Hour, ""); !errors.Is(err, budget.ErrLeaseLost) {
		t.Errorf("renew with a wrong generation: err = %v, want ErrLeaseLost", err)
	}
}

// TestLeaseCapHoldsInTheDatabase: a lease is at most an hour, whatever a
// caller with the node role sends: ledger_reserve and ledger_renew, called
// directly as fanout_app (past the Go checks), refuse a longer one and
// take exactly one hour.
func TestLeaseCapHoldsInTheDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "lease-cap", 1000, 1, 1000)
	conn := nodeConn(t, b)
	var id, gen int64
	var outcome string
	reserve := `SELECT outcome, reservation_id, generation FROM ledger_reserve($1, $2, $3, 1, 10, 1, 'n', $4::interval, NULL)`
	if err := conn.QueryRow(b.ctx, reserve, int64(ra.Tasks["t0"]), "lease-cap", "tenant-a", "1 hour").Scan(&outcome, &id, &gen); err != nil || outcome != "ok" {
		t.Fatalf("reserve with a lease of exactly an hour: %s, %v", outcome, err)
	}
	if _, err := conn.Exec(b.ctx, reserve, int64(ra.Tasks["t0"]), "lease-cap", "tenant-a", "1 hour 1 second"); err == nil ||
		!strings.Contains(err.Error(), "at most 1 hour") {
		t.Errorf("reserve with a lease of an hour and a second: err = %v; want refused (at most 1 hour)", err)
	}
	renew := `SELECT outcome FROM ledger_renew($1, $2, $3::interval)`
	if _, err := conn.Exec(b.ctx, renew, id, gen, "1 hour 1 second"); err == nil || !strings.Contains(err.Error(), "at most 1 hour") {
		t.Errorf("renew for an hour and a second: err = %v; want refused (at most 1 hour)", err)
	}
	if _, err := conn.Exec(b.ctx, renew, id, gen, "100 years"); err == nil {
		t.Error("renew for 100 years was accepted")
	}
	var left time.Duration
	if err := conn.QueryRow(b.ctx, renew, id, gen, "1 hour").Scan(&outcome); err != nil || outcome != "ok" {
		t.Fatalf("renew for exactly an hour: %s, %v", outcome, err)
	}
	if err := b.pool.QueryRow(b.ctx, `SELECT lease_expires_at - now() FROM reservation WHERE reservation_id = $1`, id).Scan(&left); err != nil ||
		left > time.Hour || left < 59*time.Minute {
		t.Errorf("lease left after renewing for an hour = %v, %v; want at most an hour", left, err)
	}
}
