package store_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store"
)

// TestBoundaryRaceSliced is TestBoundaryRace on budget slices
// (docs/ledger.md#budget-slices): 120 goroutines, half through group
// commit, reserve and settle (some past the grant) or void on the sliced
// tasks of one run under a tenant until the run is exhausted. No row —
// tenant, run, slice — is ever reserved and spent past its limit at any
// prefix of its journal, most calls are paid by their slice alone, and at
// the close every slice is posted and every account conserved.
func TestBoundaryRaceSliced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const limit = 300_000
	ten, err := b.ledger.OpenTenant(b.ctx, "tenant-a", 3*limit)
	if err != nil {
		t.Fatal(err)
	}
	ra := b.openSliced(t, "race", ten.ID, limit, 64, limit/4, 4_000, 6)
	var accounts []budget.AccountID
	for _, id := range ra.Tasks {
		accounts = append(accounts, id)
	}
	coalesced := store.NewLedger(b.pool, store.LedgerConfig{Coalesce: true})
	defer coalesced.Close()
	var total, other raceStats
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); other = raceClients(b.ctx, coalesced, accounts, 60, 18, "parent-coalesced") }()
	total = raceClients(b.ctx, b.ledger, accounts, 60, 17, "parent")
	wg.Wait()
	total.add(other)
	t.Logf("race: %+v", total)
	if total.CheckFired != 0 || total.OtherErrors != 0 {
		t.Fatalf("%d CHECK violations, %d other errors; first: %s", total.CheckFired, total.OtherErrors, total.FirstProblem)
	}
	if total.Overruns == 0 {
		t.Error("no settle went over its grant: the top-up of a settle was not exercised")
	}
	run := b.account(t, ra.Run.ID)
	if run.State != budget.StateExhausted {
		t.Errorf("run state = %s, want exhausted", run.State)
	}
	var onSlice, onChain, carves int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE cardinality(chain) = 1), count(*) FILTER (WHERE cardinality(chain) > 1),
		(SELECT count(*) FROM ledger_entry WHERE kind = 'carve' AND cardinality(chain) = 1)
		FROM reservation WHERE run_id = 'race'`).Scan(&onSlice, &onChain, &carves); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d calls paid by their slice alone, %d carves (6 at begin, the rest top-ups)", onSlice, carves)
	if onChain != 0 || onSlice == 0 || carves <= 6 {
		t.Errorf("%d reservations on a slice, %d on a chain, %d carves: want every call on its slice and some top-ups", onSlice, onChain, carves)
	}
	ids := append([]budget.AccountID{ten.ID, ra.Run.ID}, accounts...)
	for _, id := range ids {
		b.checkRowJournalNeverOverLimit(t, id)
	}
	if _, err := b.ledger.CloseRun(b.ctx, "race"); err != nil {
		t.Fatal(err)
	}
	run = b.account(t, ra.Run.ID)
	var slicesSpent int64
	if err := b.pool.QueryRow(b.ctx, `SELECT coalesce(sum(spent), 0) FROM account WHERE run_id = 'race' AND kind = 'task'`).Scan(&slicesSpent); err != nil {
		t.Fatal(err)
	}
	if run.State != budget.StateClosed || run.Reserved != 0 || run.Spent != slicesSpent || run.Spent > run.Limit {
		t.Errorf("closed run %+v: want closed, reserved 0, spent = its slices' %d <= limit", run, slicesSpent)
	}
	if tn := b.account(t, ten.ID); tn.Reserved != 0 || tn.Spent != run.Spent {
		t.Errorf("tenant after the close: reserved %d spent %d, want 0 and the run's %d", tn.Reserved, tn.Spent, run.Spent)
	}
	for _, id := range ids {
		b.checkRowJournalNeverOverLimit(t, id)
	}
	b.checkConserved(t)
}

// checkRowJournalNeverOverLimit asserts I1 on one account's journal: in
// entry_id order (each entry is written under that account's row lock),
// no prefix of the entries whose chain holds it reserves, spends and holds
// more than the limit the same prefix gives it. A slice's limit moves
// (carve, return), so the limit is summed too.
func (b *testBundle) checkRowJournalNeverOverLimit(t *testing.T, id budget.AccountID) {
	t.Helper()
	var entries int
	var over, at int64
	err := b.pool.QueryRow(b.ctx, `
		SELECT count(*), coalesce(max(used - lim), 0),
		       coalesce((array_agg(entry_id ORDER BY used - lim DESC, entry_id))[1], 0)
		  FROM (SELECT entry_id,
		               sum(delta_reserved + delta_spent + delta_held) OVER w AS used,
		               sum(delta_limit) OVER w AS lim
		          FROM ledger_entry WHERE $1 = ANY (chain)
		        WINDOW w AS (ORDER BY entry_id)) j`, int64(id)).Scan(&entries, &over, &at)
	if err != nil {
		t.Fatal(err)
	}
	if entries < 2 {
		t.Errorf("account %d: %d journal entries; the race did not reach it", id, entries)
	}
	if over > 0 {
		t.Errorf("account %d: after entry %d its reserved+spent was %s tokens over its limit (I1)", id, at, fmt.Sprint(over))
	}
}
