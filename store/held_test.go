package store_test

import (
	"errors"
	"testing"

	"github.com/fanout/fanout/budget"
)

// TestSynthesisAllowanceIsHeld (I19): what a run holds back for its
// synthesis is available to no subagent — the run is exhausted at its limit
// minus what it holds, an overrun is not paid from it — and the synthesis
// draws on it after the run is exhausted. What a synthesis call does not
// spend is held again for the next; a void gives it back whole; the run's
// end releases the rest. The ledger is conserved throughout.
func TestSynthesisAllowanceIsHeld(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra, err := b.ledger.OpenRun(b.ctx, budget.OpenRunParams{RunID: "r", TenantID: "tenant-a", Limit: 1000,
		MinReservation: 100, Held: 300, Tasks: []budget.TaskBudget{{TaskID: "x", Limit: 1000}}})
	if err != nil {
		t.Fatal(err)
	}
	if ra.Run.Held != 300 || ra.Run.Available() != 700 {
		t.Fatalf("opened run holds %d, available %d; want 300 held, 700 available", ra.Run.Held, ra.Run.Available())
	}
	beginAttempts(t, b.ledger, ra)
	task := func(want, minimum int64) (budget.Reservation, error) {
		return b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["x"], Want: want, Min: minimum,
			Holder: "n", TTL: ttl}))
	}
	r, err := task(1000, 100)
	if err != nil || r.Amount != 700 {
		t.Fatalf("task reserve = %+v, %v; want 700 (the limit minus what is held)", r, err)
	}
	// The grant left nothing available: the run is exhausted for subagents.
	if _, err := task(1, 1); !errors.Is(err, budget.ErrExhausted) {
		t.Fatalf("a task reserve after the run's available is gone = %v; want exhausted", err)
	}
	// An overrun is paid from what is available (nothing), never from what
	// is held.
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r.ID, Generation: 1, Actual: 900}); err != nil {
		t.Fatal(err)
	}
	run, err := b.ledger.RunAccount(b.ctx, "r")
	if err != nil || run.Spent != 700 || run.Held != 300 || run.State != budget.StateExhausted {
		t.Fatalf("run after the overrun = %+v, %v; want spent 700, held 300, exhausted", run, err)
	}
	// The synthesis begins an attempt on the exhausted run and draws on
	// what it holds.
	a, err := b.ledger.BeginAttempt(b.ctx, ra.Run.ID, "r", "tenant-a")
	if err != nil {
		t.Fatalf("begin the synthesis's attempt on the exhausted run: %v", err)
	}
	synth := func(want, minimum int64, fromHeld bool) (budget.Reservation, error) {
		return b.ledger.Reserve(b.ctx, budget.ReserveParams{Account: ra.Run.ID, RunID: "r", TenantID: "tenant-a",
			Attempt: a.N, Secret: a.Secret, Want: want, Min: minimum, Holder: "n", TTL: ttl, FromHeld: fromHeld})
	}
	if _, err := synth(100, 1, false); !errors.Is(err, budget.ErrExhausted) {
		t.Fatalf("a reserve on the run not from held = %v; want exhausted", err)
	}
	s1, err := synth(200, 50, true)
	if err != nil || s1.Amount != 200 {
		t.Fatalf("synthesis reserve from held = %+v, %v; want 200", s1, err)
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: s1.ID, Generation: 1, Actual: 120}); err != nil {
		t.Fatal(err)
	}
	// 80 unspent is held again: 100 + 80.
	s2, err := synth(1000, 1, true)
	if err != nil || s2.Amount != 180 {
		t.Fatalf("second synthesis reserve = %+v, %v; want 180 (100 held + 80 unspent by the first)", s2, err)
	}
	if _, err := b.ledger.Void(b.ctx, s2.ID, 1, ""); err != nil {
		t.Fatal(err)
	}
	if run, _ := b.ledger.RunAccount(b.ctx, "r"); run.Held != 180 || run.Spent != 820 {
		t.Fatalf("after the void: held %d, spent %d; want 180 held again, 820 spent", run.Held, run.Spent)
	}
	b.checkConserved(t)
	// The run's end releases what is still held.
	run, err = b.ledger.CloseRun(b.ctx, "r")
	if err != nil || run.Held != 0 || run.State != budget.StateClosed {
		t.Fatalf("closed run = %+v, %v; want nothing held, closed", run, err)
	}
	if _, err := synth(1, 1, true); !errors.Is(err, budget.ErrExhausted) {
		t.Fatalf("a synthesis reserve after the run closed = %v; want refused", err)
	}
	b.checkConserved(t)
}

// TestTenantHoldsWhatItsRunsHold: under a tenant budget the tenant's
// account holds each run's allowance, so another run of the tenant cannot
// take it; a run holds no more than the tenant has; a cancel releases it.
func TestTenantHoldsWhatItsRunsHold(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ten, err := b.ledger.OpenTenant(b.ctx, "tenant-a", 1000)
	if err != nil {
		t.Fatal(err)
	}
	open := func(id string, held int64) budget.RunAccounts {
		t.Helper()
		ra, err := b.ledger.OpenRun(b.ctx, budget.OpenRunParams{RunID: id, TenantID: "tenant-a", TenantAccount: ten.ID,
			Limit: 1000, MinReservation: 1, Held: held, Tasks: []budget.TaskBudget{{TaskID: "x", Limit: 1000}}})
		if err != nil {
			t.Fatal(err)
		}
		beginAttempts(t, b.ledger, ra)
		return ra
	}
	r1 := open("r1", 400)
	r2 := open("r2", 0)
	got, err := b.ledger.Reserve(b.ctx, grant(r2, budget.ReserveParams{Account: r2.Tasks["x"], Want: 1000, Min: 1, Holder: "n", TTL: ttl}))
	if err != nil || got.Amount != 600 {
		t.Fatalf("r2's reserve = %+v, %v; want 600 (the tenant's 1000 minus the 400 r1 holds)", got, err)
	}
	if r3 := open("r3", 500); r3.Run.Held != 0 {
		t.Fatalf("r3 holds %d; want 0 (the tenant had nothing left to hold)", r3.Run.Held)
	}
	b.checkConserved(t)
	if _, err := b.ledger.CancelRun(b.ctx, "r1", "stop"); err != nil {
		t.Fatal(err)
	}
	if tb, err := b.ledger.TenantAccount(b.ctx, "tenant-a"); err != nil || tb.Held != 0 || tb.Available() != 400 {
		t.Fatalf("tenant after r1's cancel = %+v, %v; want nothing held, 400 available", tb, err)
	}
	_ = r1
	b.checkConserved(t)
}
