package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
)

// TestReserveNeedsTheGrant (I13): a reserve that names another run or
// tenant than the account's, or an attempt that is not the account's
// current one, is refused and writes nothing. (Issue 9, defect 1: a worker
// spent from whatever account the caller named.)
func TestReserveNeedsTheGrant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	victim := b.openRun(t, "victim", 60_000, 1, 60_000)
	intruder := b.openRun(t, "intruder", 1000, 1, 1000)
	acct := victim.Tasks["t0"]
	before := b.count(t, "reservation")
	for _, tc := range []struct {
		name string
		p    budget.ReserveParams
	}{
		{"another run's id", budget.ReserveParams{RunID: intruder.Run.RunID, TenantID: "tenant-a", Attempt: 1}},
		{"another tenant", budget.ReserveParams{RunID: "victim", TenantID: "globex", Attempt: 1}},
		{"a stale attempt", budget.ReserveParams{RunID: "victim", TenantID: "tenant-a", Attempt: 0 + 2}},
		{"the victim's run account, named as another run", budget.ReserveParams{RunID: "intruder", TenantID: "tenant-a", Attempt: 1}},
	} {
		p := tc.p
		p.Account, p.Want, p.Min, p.Holder, p.TTL = acct, 1<<31-1, 1, "intruder", ttl
		if tc.name == "the victim's run account, named as another run" {
			p.Account = victim.Run.ID
		}
		_, err := b.ledger.Reserve(b.ctx, p)
		var de *budget.DeniedError
		if !errors.As(err, &de) || !errors.Is(err, budget.ErrDenied) {
			t.Errorf("%s: err = %v, want a *DeniedError", tc.name, err)
		}
	}
	// The current attempt moves on: the old one is fenced, the new one granted.
	a, err := b.ledger.BeginAttempt(b.ctx, acct, "victim", "tenant-a")
	if err != nil || a.N != 2 {
		t.Fatalf("begin attempt = %d, %v; want 2", a.N, err)
	}
	if _, err := b.ledger.Reserve(b.ctx, grant(victim, budget.ReserveParams{Account: acct, Want: 10, Min: 1, Holder: "n", TTL: ttl})); !errors.Is(err, budget.ErrDenied) {
		t.Errorf("reserve with the superseded attempt 1: err = %v, want ErrDenied", err)
	}
	if got := b.count(t, "reservation"); got != before {
		t.Errorf("refused reserves wrote %d reservations", got-before)
	}
	p := grant(victim, budget.ReserveParams{Account: acct, Want: 10, Min: 1, Holder: "n", TTL: ttl})
	p.Attempt = 2
	if _, err := b.ledger.Reserve(b.ctx, p); err != nil {
		t.Errorf("reserve with the current attempt 2: %v", err)
	}
	// The functions check their own parameters, whatever a caller sends:
	// no NULL attempt slips past the fence, no lease outlasts an hour.
	for _, q := range []string{
		`SELECT outcome FROM ledger_reserve($1, 'victim', 'tenant-a', NULL, 10, 1, 'n', '1 minute', 'k')`,
		`SELECT outcome FROM ledger_reserve($1, 'victim', 'tenant-a', 2, 10, 1, 'n', '2 hours', NULL)`,
	} {
		var outcome string
		if err := b.pool.QueryRow(b.ctx, q, int64(acct)).Scan(&outcome); sqlState(err) != "22023" {
			t.Errorf("%s: outcome %q, err %v; want invalid_parameter_value", q, outcome, err)
		}
	}
	// BeginAttempt checks the same grant.
	if _, err := b.ledger.BeginAttempt(b.ctx, acct, "intruder", "tenant-a"); !errors.Is(err, budget.ErrDenied) {
		t.Errorf("begin attempt for another run: err = %v, want ErrDenied", err)
	}
	if _, err := b.ledger.CloseRun(b.ctx, "intruder"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.BeginAttempt(b.ctx, intruder.Tasks["t0"], "intruder", "tenant-a"); !errors.Is(err, budget.ErrExhausted) {
		t.Errorf("begin attempt on a closed run: err = %v, want ErrExhausted", err)
	}
	b.checkConserved(t)
}

// TestResolvedReservationNeverGrantsAgain (I14): a reserve whose key names
// a reservation that was settled, voided or expired is refused, also on a
// closed run, instead of returning it as a grant. (Issue 9, defect 2.)
func TestResolvedReservationNeverGrantsAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "replay", 10_000, 1, 10_000)
	p := grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 100, Min: 1, Holder: "n", TTL: ttl})
	reserve := func(key string) (budget.Reservation, error) {
		q := p
		q.Key = key
		return b.ledger.Reserve(b.ctx, q)
	}
	settled, err := reserve("replay/t0/a1/i1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: settled.ID, Generation: 1, Actual: 40}); err != nil {
		t.Fatal(err)
	}
	voided, err := reserve("replay/t0/a1/i2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Void(b.ctx, voided.ID, 1, ""); err != nil {
		t.Fatal(err)
	}
	held, err := reserve("replay/t0/a1/i3")
	if err != nil {
		t.Fatal(err)
	}
	// A retry of a held grant by its holder gets it back; another node does not.
	if again, err := reserve("replay/t0/a1/i3"); err != nil || again.ID != held.ID || again.State != budget.ReservationHeld {
		t.Errorf("retry of a held grant = %+v, %v; want reservation %d, held", again, err, held.ID)
	}
	q := p
	q.Key, q.Holder = "replay/t0/a1/i3", "other-node"
	if _, err := b.ledger.Reserve(b.ctx, q); !errors.Is(err, budget.ErrConflict) {
		t.Errorf("another holder with the key of a held grant: err = %v, want ErrConflict", err)
	}
	for key, want := range map[string]budget.ReservationState{
		"replay/t0/a1/i1": budget.ReservationSettled,
		"replay/t0/a1/i2": budget.ReservationVoided,
	} {
		_, err := reserve(key)
		var re *budget.ResolvedError
		if !errors.As(err, &re) || re.State != want {
			t.Errorf("reserve with the key of a %s reservation: err = %v, want a *ResolvedError (%s)", want, err, want)
		}
	}
	// The database's own refusal, as a node calling the function directly
	// (not through store.Ledger, which also refuses) would meet it.
	var outcome string
	if err := b.pool.QueryRow(b.ctx, `SELECT outcome FROM ledger_reserve($1, 'replay', 'tenant-a', 1, 100, 1, 'n', '1 minute', $2)`,
		int64(ra.Tasks["t0"]), "replay/t0/a1/i1").Scan(&outcome); err != nil || outcome != "resolved" {
		t.Errorf("ledger_reserve with the key of a settled reservation: outcome %q, %v; want resolved", outcome, err)
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: held.ID, Generation: 1, Actual: 10}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.CloseRun(b.ctx, "replay"); err != nil {
		t.Fatal(err)
	}
	// Ended: refused, keyed or not; the journal gained nothing.
	entries := b.count(t, "ledger_entry")
	if _, err := reserve("replay/t0/a1/i1"); !errors.Is(err, budget.ErrResolved) && !errors.Is(err, budget.ErrExhausted) {
		t.Errorf("replayed key on a closed run: err = %v, want refused", err)
	}
	if _, err := reserve("replay/t0/a1/i9"); !errors.Is(err, budget.ErrExhausted) {
		t.Errorf("new key on a closed run: err = %v, want ErrExhausted", err)
	}
	if got := b.count(t, "ledger_entry"); got != entries {
		t.Errorf("refused reserves wrote %d ledger entries", got-entries)
	}
	b.checkConserved(t)
}

// TestCloseNeverRefundsHeldSpend: closing a run that still holds a
// reservation cancels it and waits: the holder's later settle is recorded
// in full, and the run closes then; a lease that runs out is posted as
// estimated spend. (Issue 9, defect 3: a timed-out synthesis call's spend
// was voided by the close.)
func TestCloseNeverRefundsHeldSpend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "hold", 10_000, 1, 10_000, 10_000)
	r1, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 1000, Min: 1, Holder: "n", TTL: ttl}))
	if err != nil {
		t.Fatal(err)
	}
	const leaseTTL = 300 * time.Millisecond
	r2, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Run.ID, Want: 500, Min: 1, Holder: "gone", TTL: leaseTTL}))
	if err != nil {
		t.Fatal(err)
	}
	acct, err := b.ledger.CloseRun(b.ctx, "hold")
	if err != nil {
		t.Fatal(err)
	}
	if acct.State != budget.StateCancelled || !acct.Closing || acct.Reserved != 1500 {
		t.Fatalf("run after close with reservations held = %+v; want cancelled, closing, 1500 reserved", acct)
	}
	if _, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t1"], Want: 10, Min: 1, Holder: "n", TTL: ttl})); !errors.Is(err, budget.ErrExhausted) {
		t.Errorf("reserve on a closing run: err = %v, want ErrExhausted", err)
	}
	s, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r1.ID, Generation: 1, Actual: 900})
	if err != nil || s.Spent != 900 {
		t.Fatalf("settle after close = %+v, %v; want 900 spent", s, err)
	}
	if acct, _ := b.ledger.RunAccount(b.ctx, "hold"); acct.State != budget.StateCancelled {
		t.Errorf("run closed while reservation %d was still held: %+v", r2.ID, acct)
	}
	// The other holder is gone: its lease runs out and the sweeper posts it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := b.ledger.ExpireLeases(b.ctx); err != nil {
			t.Fatal(err)
		}
		acct, err = b.ledger.RunAccount(b.ctx, "hold")
		if err != nil {
			t.Fatal(err)
		}
		if acct.State == budget.StateClosed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run still %s (reserved %d) 10 s after its last lease should have ended", acct.State, acct.Reserved)
		}
		time.Sleep(50 * time.Millisecond) // polling the database's clock, bounded by the deadline
	}
	if acct.Spent != 1400 || acct.Reserved != 0 || acct.Closing {
		t.Errorf("closed run = %+v; want 1400 spent (900 settled + 500 expired), nothing reserved, not closing", acct)
	}
	var voids int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM ledger_entry WHERE run_id = 'hold' AND kind = 'void'").Scan(&voids); err != nil || voids != 0 {
		t.Errorf("voids in the run's journal = %d, %v; want 0", voids, err)
	}
	b.checkConserved(t)
}

// TestBeginAttemptWaitsOnlyForItsAccount: beginning an attempt takes the row
// lock of the one account it bumps, not the run's: while another
// transaction holds the run account (as every reserve of the run does, from
// its start to its commit), a dispatch of another task still begins at
// once; only a transaction on the task's own account holds it back. (Issue
// 11: `make bench-compare` found a 1,000-task run's dispatches queued on
// the run account's lock, one commit apart.) The fence holds: the attempt
// it returns is the only one that can reserve.
func TestBeginAttemptWaitsOnlyForItsAccount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "busy", 10_000, 1, 1000, 1000)
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	if _, err := tx.Exec(b.ctx, "SELECT 1 FROM fanout.account WHERE account_id = $1 FOR UPDATE", int64(ra.Run.ID)); err != nil {
		t.Fatalf("lock the run account: %v", err)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	a, err := b.ledger.BeginAttempt(ctx, ra.Tasks["t0"], "busy", "tenant-a")
	if err != nil || a.N != 2 {
		t.Fatalf("begin attempt on t0 while the run account is locked: attempt %d, %v; want 2 at once", a.N, err)
	}
	// A transaction on t1 itself (a reserve under way on it) holds t1's
	// attempt back until it ends.
	if _, err := tx.Exec(b.ctx, "SELECT 1 FROM fanout.account WHERE account_id = $1 FOR UPDATE", int64(ra.Tasks["t1"])); err != nil {
		t.Fatalf("lock t1: %v", err)
	}
	type begun struct {
		n   int64
		err error
	}
	done := make(chan begun, 1)
	go func() {
		n, err := b.ledger.BeginAttempt(ctx, ra.Tasks["t1"], "busy", "tenant-a")
		done <- begun{n.N, err}
	}()
	// It waits on a lock (seen in pg_stat_activity), and has not returned.
	deadline := time.Now().Add(10 * time.Second)
	for waiting := false; !waiting; {
		if err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%ledger_begin_attempt%')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-done:
			t.Fatalf("begin attempt on t1 while t1 is locked returned attempt %d, %v; want it to wait", r.n, r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("begin attempt on t1 never waited on t1's lock")
		}
		time.Sleep(10 * time.Millisecond) // polling pg_stat_activity, bounded by deadline
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	n1 := r.n
	if r.err != nil || n1 != 2 {
		t.Fatalf("begin attempt on t1 once the lock went: attempt %d, %v; want 2", n1, r.err)
	}
	// The fence: attempt 1 of t0 is refused, attempt 2 granted.
	p := grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 10, Min: 1, Holder: "n", TTL: ttl})
	if _, err := b.ledger.Reserve(b.ctx, p); !errors.Is(err, budget.ErrDenied) {
		t.Errorf("reserve by the superseded attempt 1: %v, want ErrDenied", err)
	}
	p.Attempt = 2
	if _, err := b.ledger.Reserve(b.ctx, p); err != nil {
		t.Errorf("reserve by the current attempt 2: %v", err)
	}
	// A run that ended begins no attempt, and bumps nothing.
	if _, err := b.ledger.CancelRun(b.ctx, "busy", "done"); err != nil {
		t.Fatal(err)
	}
	var ex *budget.ExhaustedError
	if _, err := b.ledger.BeginAttempt(ctx, ra.Tasks["t1"], "busy", "tenant-a"); !errors.As(err, &ex) || ex.State != budget.StateCancelled {
		t.Errorf("begin attempt on a cancelled run: %v, want an *ExhaustedError in state cancelled", err)
	}
	if a, err := b.ledger.Account(b.ctx, ra.Tasks["t1"]); err != nil || a.Attempt != n1 {
		t.Errorf("t1's attempt after a refused begin = %d, %v; want %d", a.Attempt, err, n1)
	}
}
