package store_test

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
)

// TestReserveBatchSaysWindDownAsReserve: ledger_reserve_batch, the
// set-based path of every batch of reserves a worker's group commit makes,
// tells each grant on a wound-down task account so (ledger_result.wind_down,
// docs/budget.md "Wind-down instead of cut-off") as ledger_reserve does, and
// no grant on another account. First one batch that only the set-based
// path answers (new keys, open accounts, grants well within every limit):
// a call on each task of a run of which half were wound down, and one on
// the run account; its answers must be what ledger_reserve one by one
// answers (TestReserveBatchAnswersAsReserve's comparison, in one
// transaction), and each grant's wind_down is checked by name. Then random
// batches over two runs, as in TestReserveBatchAnswersAsReserve, while
// tasks are wound down between rounds: every round answers as
// ledger_reserve.
func TestReserveBatchSaysWindDownAsReserve(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "r1", 100_000, 20, 5_000, 5_000, 5_000, 5_000, 5_000, 5_000)
	wound := map[int64]bool{}
	if err := b.ledger.WindDown(b.ctx, "r1", 0, []string{"t0", "t2", "t4"}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"t0", "t2", "t4"} {
		wound[int64(ra.Tasks[id])] = true
	}
	call := func(account int64, want int64, key string) reserveCall {
		return reserveCall{account: account, run: "r1", tenant: "tenant-a", attempt: 1, want: want, min: 1, holder: "w1", key: key}
	}
	var calls []reserveCall
	for i := range 6 {
		calls = append(calls, call(int64(ra.Tasks[fmt.Sprintf("t%d", i)]), int64(100+i), fmt.Sprintf("first-t%d", i)))
	}
	calls = append(calls, call(int64(ra.Run.ID), 50, "first-run"))
	// Twice on a wound-down task and twice on another: later calls of a
	// batch on one account are granted from the rows the batch holds.
	calls = append(calls, call(int64(ra.Tasks["t0"]), 70, "second-t0"), call(int64(ra.Tasks["t1"]), 70, "second-t1"))
	if batched, sequential := b.reserveBothWays(t, calls); batched != sequential {
		t.Fatalf("%d calls on a run with t0, t2 and t4 wound down\nledger_reserve_batch:\n%s\nledger_reserve one by one:\n%s",
			len(calls), batched, sequential)
	}
	var answers []string
	if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		answers, err = reserveBatch(b.ctx, tx, calls)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for i, a := range answers {
		var r struct {
			Outcome   string `json:"outcome"`
			AccountID int64  `json:"account_id"`
			Amount    int64  `json:"amount"`
			WindDown  *bool  `json:"wind_down"`
		}
		if err := json.Unmarshal([]byte(a), &r); err != nil {
			t.Fatal(err)
		}
		c := calls[i]
		if r.Outcome != "ok" || r.AccountID != c.account || r.Amount != c.want {
			t.Fatalf("call %d (%d tokens on account %d): %s; want all of it granted", i, c.want, c.account, a)
		}
		if r.WindDown == nil || *r.WindDown != wound[c.account] {
			t.Errorf("call %d (key %s, account %d, wound down %v): the grant says wind_down %v",
				i, c.key, c.account, wound[c.account], r.WindDown)
		}
	}

	// Random rounds, winding tasks down as they go.
	r2 := b.openRun(t, "r2", 20_000, 20, 3_000, 3_000, 3_000)
	accounts := []int64{int64(ra.Run.ID), int64(r2.Run.ID)}
	runOf := map[int64]string{int64(ra.Run.ID): "r1", int64(r2.Run.ID): "r2"}
	var tasks []woundTask
	for _, x := range []budget.RunAccounts{ra, r2} {
		for id, acct := range x.Tasks {
			accounts = append(accounts, int64(acct))
			runOf[int64(acct)] = x.Run.RunID
			tasks = append(tasks, woundTask{x.Run.RunID, id, int64(acct)})
		}
	}
	slices.Sort(accounts)
	slices.SortFunc(tasks, func(x, y woundTask) int { return cmp.Compare(x.account, y.account) })
	rng := rand.New(rand.NewPCG(41, 3))
	var okWound int
	for round := range 30 {
		if round%5 == 0 { // wind one more task down
			tk := tasks[rng.IntN(len(tasks))]
			if err := b.ledger.WindDown(b.ctx, tk.run, 0, []string{tk.id}); err != nil {
				t.Fatal(err)
			}
			wound[tk.account] = true
		}
		calls := make([]reserveCall, 1+rng.IntN(12))
		for i := range calls {
			acct := accounts[rng.IntN(len(accounts))]
			c := call(acct, 1+rng.Int64N(400), fmt.Sprintf("k%d-%d", round, i))
			c.run = runOf[acct]
			c.min = 1 + rng.Int64N(c.want)
			if i > 0 && rng.IntN(8) == 0 { // a key earlier in this batch
				k := calls[rng.IntN(i)]
				c.account, c.run, c.key = k.account, k.run, k.key
			}
			calls[i] = c
		}
		answers := b.reserveBothWaysThenKeep(t, round, calls)
		for _, a := range answers {
			var r struct {
				Outcome  string `json:"outcome"`
				WindDown *bool  `json:"wind_down"`
			}
			if err := json.Unmarshal([]byte(a), &r); err != nil {
				t.Fatal(err)
			}
			if r.Outcome == "ok" && r.WindDown != nil && *r.WindDown {
				okWound++
			}
		}
	}
	if okWound == 0 {
		t.Error("no random batch granted a call on a wound-down account: the rounds compared nothing of wind_down")
	}
	b.checkConserved(t)
}

// woundTask is a task account a round may wind down.
type woundTask struct {
	run, id string
	account int64
}
