package store_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/fanout/fanout/budget"
)

// TestReserveBatchAnswersAsReserveSliced is TestReserveBatchAnswersAsReserve
// with budget slices (docs/ledger.md#budget-slices): ledger_reserve_batch
// answers and leaves the ledger as ledger_reserve called one after another,
// for batches that mix calls their slice pays for, calls past the slice (a
// top-up, a recall, a refusal naming the task, the run or the tenant), the
// same task twice or more in one batch (the second call fitting only what
// the first left), and calls on unsliced tasks and on the run.
func TestReserveBatchAnswersAsReserveSliced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ten := b.openTenant(t, 9000)
	open := func(id string, limit int64, sliced []bool) budget.RunAccounts {
		t.Helper()
		p := budget.OpenRunParams{RunID: id, TenantID: "tenant-a", TenantAccount: ten.ID, Limit: limit, MinReservation: 20}
		for i, s := range sliced {
			tb := budget.TaskBudget{TaskID: fmt.Sprintf("t%d", i), Limit: 400 + 300*int64(i)}
			if s {
				tb.Slice = 100 + 50*int64(i)
			}
			p.Tasks = append(p.Tasks, tb)
		}
		ra, err := b.ledger.OpenRun(b.ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		beginAttempts(t, b.ledger, ra)
		return ra
	}
	runs := []budget.RunAccounts{open("r1", 3000, []bool{true, true, true, true}), open("r2", 4000, []bool{true, false, true})}
	var targets []reserveCall
	for _, ra := range runs {
		targets = append(targets, reserveCall{account: int64(ra.Run.ID), run: ra.Run.RunID})
		for i := range len(ra.Tasks) {
			targets = append(targets, reserveCall{account: int64(ra.Tasks[fmt.Sprint("t", i)]), run: ra.Run.RunID})
		}
	}
	call := func(tg reserveCall, want, minimum int64, key string) reserveCall {
		tg.tenant, tg.attempt, tg.holder, tg.want, tg.min, tg.key = "tenant-a", 1, "w1", want, minimum, key
		return tg
	}
	r1t0, r1t1, r2t1 := targets[1], targets[2], targets[7]
	// First the cases by name: the slice of t0 of r1 is 100, t1's 150.
	fixed := [][]reserveCall{
		{call(r1t0, 40, 1, "a1"), call(r1t0, 50, 1, "a2")},                                                      // the same slice twice, both fit
		{call(r1t0, 5, 1, "b1"), call(r1t0, 20, 20, "b2"), call(r1t1, 60, 1, "b3")},                             // the second no longer fits: a top-up
		{call(r2t1, 80, 1, "c1"), call(r1t1, 30, 1, "c2"), call(r1t0, 900, 900, "c3"), call(r1t0, 10, 1, "c4")}, // unsliced, fits, past the cap, fits
	}
	var keys []reserveCall
	for round, calls := range fixed {
		b.reserveBothWaysThenKeep(t, round, calls)
		keys = append(keys, calls...)
	}
	rng := rand.New(rand.NewPCG(43, 7))
	exhausted := false
	for round := len(fixed); round < 60 && !exhausted; round++ {
		calls := make([]reserveCall, 1+rng.IntN(12))
		for i := range calls {
			tg := targets[rng.IntN(len(targets))]
			if i > 0 && rng.IntN(3) == 0 {
				j := rng.IntN(i) // an account earlier in this batch
				tg = reserveCall{account: calls[j].account, run: calls[j].run}
			}
			want := 1 + rng.Int64N(120)
			if rng.IntN(5) == 0 {
				want = 1 + rng.Int64N(600)
			}
			calls[i] = call(tg, want, 1+rng.Int64N(want), fmt.Sprintf("k%d-%d", round, i))
			if rng.IntN(10) == 0 && len(keys) > 0 { // a key of an earlier batch: a replay
				k := keys[rng.IntN(len(keys))]
				calls[i].account, calls[i].run, calls[i].key = k.account, k.run, k.key
			}
		}
		answers := b.reserveBothWaysThenKeep(t, round, calls)
		keys = append(keys, calls...)
		granted := slices.ContainsFunc(answers, func(a string) bool { return strings.Contains(a, `"outcome": "ok"`) })
		exhausted = !granted && round > 30
	}
	var onSlice, topups int
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM reservation WHERE cardinality(chain) = 1),
		(SELECT count(*) FROM ledger_entry WHERE kind = 'carve' AND cardinality(chain) = 1) - 5`).Scan(&onSlice, &topups); err != nil {
		t.Fatal(err)
	}
	var states []string
	if err := b.pool.QueryRow(b.ctx, `SELECT array_agg(DISTINCT state) FROM account WHERE tenant_id = 'tenant-a'`).Scan(&states); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d calls on a slice, %d top-ups, account states %v", onSlice, topups, states)
	if !slices.Contains(states, "exhausted") {
		t.Errorf("no account ended exhausted (states %v): the rounds did not reach the ledger's limits", states)
	}
	if onSlice == 0 || topups == 0 {
		t.Errorf("%d calls on a slice, %d top-ups: the batches did not reach both paths", onSlice, topups)
	}
	b.checkConserved(t)
}
