package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// reserveCall is one call of ledger_reserve, as ledger_reserve_batch takes it.
type reserveCall struct {
	account, attempt, want, min int64
	run, tenant, holder, key    string
	model                       string
	fromHeld                    bool
}

// TestReserveBatchAnswersAsReserve: ledger_reserve_batch does what the
// same calls of ledger_reserve do one after another, in the order given:
// the same answers, the same accounts, the same reservations and ledger
// entries (their ids aside). Random batches, each made both ways from the
// same ledger in one transaction (batch, then rolled back to a savepoint
// and made one by one), over two runs under a tenant budget, with what
// sends a call down ledger_reserve's own path mixed in: a key seen before
// (in an earlier batch, or earlier in this one), another holder's key, a
// stale attempt, another run's account, an unknown account, a draw on what
// the run holds, grants that exhaust a task, the run or the tenant.
func TestReserveBatchAnswersAsReserve(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ten, err := b.ledger.OpenTenant(b.ctx, "tenant-a", 6000)
	if err != nil {
		t.Fatal(err)
	}
	open := func(id string, limit, held int64, tasks int) budget.RunAccounts {
		t.Helper()
		p := budget.OpenRunParams{RunID: id, TenantID: "tenant-a", TenantAccount: ten.ID, Limit: limit, MinReservation: 20, Held: held}
		for i := range tasks {
			p.Tasks = append(p.Tasks, budget.TaskBudget{TaskID: fmt.Sprintf("t%d", i), Limit: 200 + 150*int64(i)})
		}
		ra, err := b.ledger.OpenRun(b.ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		beginAttempts(t, b.ledger, ra)
		return ra
	}
	runs := []budget.RunAccounts{open("r1", 2500, 200, 5), open("r2", 5000, 0, 3)}
	type target struct {
		account int64
		run     string
		kind    string
	}
	var targets []target
	for _, ra := range runs {
		targets = append(targets, target{int64(ra.Run.ID), ra.Run.RunID, "run"})
		for _, id := range ra.Tasks {
			targets = append(targets, target{int64(id), ra.Run.RunID, "task"})
		}
	}
	targets = append(targets, target{1 << 40, "r1", "none"})
	rng := rand.New(rand.NewPCG(26, 1))
	var keys []reserveCall // calls made, whose keys later calls may name again
	exhausted := false
	for round := 0; round < 40 && !exhausted; round++ {
		calls := make([]reserveCall, 1+rng.IntN(16))
		for i := range calls {
			tg := targets[rng.IntN(len(targets))]
			c := reserveCall{account: tg.account, run: tg.run, tenant: "tenant-a", attempt: 1,
				want: 1 + rng.Int64N(300), holder: "w1", key: fmt.Sprintf("k%d-%d", round, i)}
			c.min = 1 + rng.Int64N(c.want)
			switch p := rng.IntN(20); {
			case p == 0:
				c.attempt = 2 // stale: never begun
			case p == 1:
				c.run = "r2" // another run's account, or its own
			case p == 2 && tg.kind == "run":
				c.fromHeld = true
			case p == 3:
				c.holder = "w2"
			case p == 4:
				c.model = "m"
			}
			switch p := rng.IntN(10); {
			case p == 0 && len(keys) > 0: // a key of an earlier batch
				k := keys[rng.IntN(len(keys))]
				c.account, c.run, c.key = k.account, k.run, k.key
			case p == 1 && i > 0: // a key earlier in this batch
				k := calls[rng.IntN(i)]
				c.account, c.run, c.key = k.account, k.run, k.key
			}
			calls[i] = c
		}
		answers := b.reserveBothWaysThenKeep(t, round, calls)
		keys = append(keys, calls...)
		granted := slices.ContainsFunc(answers, func(a string) bool { return strings.Contains(a, `"outcome": "ok"`) })
		exhausted = !granted && round > 20
	}
	var byOutcome []string
	if err := b.pool.QueryRow(b.ctx, `SELECT array_agg(DISTINCT state) FROM account WHERE tenant_id = 'tenant-a'`).Scan(&byOutcome); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(byOutcome, "exhausted") {
		t.Errorf("no account ended exhausted (states %v): the rounds did not reach the ledger's limits", byOutcome)
	}
	b.checkConserved(t)
}

// reserveBothWaysThenKeep fails round unless calls answer the same through
// ledger_reserve_batch and ledger_reserve one by one (reserveBothWays), then makes them with ledger_reserve_batch and commits, so
// the next round starts where this one left off; it returns those answers.
func (b *testBundle) reserveBothWaysThenKeep(t *testing.T, round int, calls []reserveCall) []string {
	t.Helper()
	batched, sequential := b.reserveBothWays(t, calls)
	if batched != sequential {
		t.Fatalf("round %d: %d calls %+v\nledger_reserve_batch:\n%s\nledger_reserve one by one:\n%s",
			round, len(calls), calls, batched, sequential)
	}
	var answers []string
	if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		answers, err = reserveBatch(b.ctx, tx, calls)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return answers
}

// reserveBothWays makes calls with ledger_reserve_batch and, from the same
// ledger, one by one with ledger_reserve, in one transaction that it rolls
// back, and returns what each way answered and left, as text.
func (b *testBundle) reserveBothWays(t *testing.T, calls []reserveCall) (batched, sequential string) {
	t.Helper()
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	var mark int64
	if err := tx.QueryRow(b.ctx, `SELECT coalesce(max(reservation_id), 0) FROM reservation`).Scan(&mark); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(b.ctx, "SAVEPOINT both_ways"); err != nil {
		t.Fatal(err)
	}
	answers, err := reserveBatch(b.ctx, tx, calls)
	if err != nil {
		t.Fatal(err)
	}
	batched = ledgerState(t, b.ctx, tx, answers, mark)
	if _, err := tx.Exec(b.ctx, "ROLLBACK TO SAVEPOINT both_ways"); err != nil {
		t.Fatal(err)
	}
	answers = answers[:0]
	for _, c := range calls {
		var r string
		if err := tx.QueryRow(b.ctx, `SELECT to_jsonb(ledger_reserve($1, $2, $3, $4, $5, $6, $7, interval '1 minute', $8, $9, NULL, $10))::text`,
			c.account, c.run, c.tenant, c.attempt, c.want, c.min, c.holder, c.key, c.model, c.fromHeld).Scan(&r); err != nil {
			t.Fatal(err)
		}
		answers = append(answers, r)
	}
	return batched, ledgerState(t, b.ctx, tx, answers, mark)
}

// ledgerState is answers (ledger_result rows as JSON) and the ledger of
// tenant-a as text, with the ids of reservations after mark counted from
// the first of them, and the ids of ledger entries left out: ids taken by
// work rolled back are not given again, so the two ways' ids differ.
func ledgerState(t *testing.T, ctx context.Context, tx pgx.Tx, answers []string, mark int64) string {
	t.Helper()
	var base int64
	if err := tx.QueryRow(ctx, `SELECT coalesce(min(reservation_id), 0) FROM reservation WHERE reservation_id > $1`, mark).Scan(&base); err != nil {
		t.Fatal(err)
	}
	rel := func(id int64) string {
		if id > mark {
			return fmt.Sprintf("new+%d", id-base)
		}
		return fmt.Sprint(id)
	}
	var out []string
	for _, a := range answers {
		var m map[string]any
		if err := json.Unmarshal([]byte(a), &m); err != nil {
			t.Fatal(err)
		}
		if id, ok := m["reservation_id"].(float64); ok {
			m["reservation_id"] = rel(int64(id))
		}
		if info, ok := m["info"].(string); ok { // "the key names reservation N, ..."
			m["info"] = reservationInInfo.ReplaceAllStringFunc(info, func(w string) string {
				id, _ := strconv.ParseInt(strings.TrimPrefix(w, "reservation "), 10, 64)
				return "reservation " + rel(id)
			})
		}
		j, _ := json.Marshal(m)
		out = append(out, string(j))
	}
	for _, q := range []string{
		`SELECT to_jsonb(a)::text FROM account a WHERE tenant_id = 'tenant-a' ORDER BY account_id`,
		`SELECT (to_jsonb(r) - 'reservation_id')::text || ' id ' || CASE WHEN reservation_id > $1 THEN 'new+' || (reservation_id - $2) ELSE reservation_id::text END
		   FROM reservation r WHERE tenant_id = 'tenant-a' ORDER BY reservation_id`,
		`SELECT (to_jsonb(e) - 'entry_id' - 'reservation_id')::text || ' reservation ' || CASE WHEN reservation_id > $1 THEN 'new+' || (reservation_id - $2) ELSE coalesce(reservation_id::text, '-') END
		   FROM ledger_entry e WHERE tenant_id = 'tenant-a' ORDER BY entry_id`,
	} {
		args := []any{mark, base}
		if !strings.Contains(q, "$1") {
			args = nil
		}
		rows, err := tx.Query(ctx, q, args...)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, got...)
	}
	return strings.Join(out, "\n")
}

// reservationInInfo finds a reservation's id in a result's info.
var reservationInInfo = regexp.MustCompile(`reservation \d+`)

// reserveBatch makes calls with one ledger_reserve_batch and returns its
// rows as JSON.
func reserveBatch(ctx context.Context, tx pgx.Tx, calls []reserveCall) ([]string, error) {
	var accounts, attempts, wants, mins []int64
	var runs, tenants, holders, keys, models []string
	var ttls []time.Duration
	var secrets []*string
	var fromHeld []bool
	for _, c := range calls {
		accounts, attempts, wants, mins = append(accounts, c.account), append(attempts, c.attempt), append(wants, c.want), append(mins, c.min)
		runs, tenants, holders, keys, models = append(runs, c.run), append(tenants, c.tenant), append(holders, c.holder), append(keys, c.key), append(models, c.model)
		ttls, secrets, fromHeld = append(ttls, time.Minute), append(secrets, nil), append(fromHeld, c.fromHeld)
	}
	rows, err := tx.Query(ctx, `SELECT to_jsonb(r)::text FROM ledger_reserve_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) AS r`,
		accounts, runs, tenants, attempts, wants, mins, holders, ttls, keys, models, secrets, fromHeld)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// TestReserveBatchGrantsSeeEachOther: the calls of one batch on one task,
// and on its run, are granted from what the calls before them left.
func TestReserveBatchGrantsSeeEachOther(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "r", 400, 20, 200, 1000)
	beginAttempts(t, b.ledger, ra)
	t0, t1 := int64(ra.Tasks["t0"]), int64(ra.Tasks["t1"])
	call := func(account int64, want int64, key string) reserveCall {
		return reserveCall{account: account, run: "r", tenant: "tenant-a", attempt: 1, want: want, min: 1, holder: "w", key: key}
	}
	var answers []string
	if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		answers, err = reserveBatch(b.ctx, tx, []reserveCall{call(t0, 150, "a"), call(t0, 150, "b"), call(t1, 150, "c"), call(t1, 150, "d")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var amounts []int64
	for _, a := range answers {
		var r struct{ Amount int64 }
		if err := json.Unmarshal([]byte(a), &r); err != nil {
			t.Fatal(err)
		}
		amounts = append(amounts, r.Amount)
	}
	// t0's limit leaves 50 for its second call; the run's (400, ending
	// below 20) leaves 200 for t1's two calls: 150, then 50 - its last
	// grant would leave 0 < 20 and so exhausts the run.
	if want := []int64{150, 50, 150, 50}; !slices.Equal(amounts, want) {
		t.Fatalf("granted %v, want %v", amounts, want)
	}
}

// TestReserveBatchAsksAWorkerForTheSecret: on a worker's login each call
// of a batch must present its own attempt's secret, as ledger_reserve asks.
func TestReserveBatchAsksAWorkerForTheSecret(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ra := b.openRun(t, "r", 1000, 1, 100, 100)
	attempts := map[string]budget.Attempt{}
	for task, id := range ra.Tasks {
		a, err := b.ledger.BeginAttempt(b.ctx, id, "r", "tenant-a")
		if err != nil {
			t.Fatal(err)
		}
		attempts[task] = a
	}
	pool, err := store.OpenPool(b.ctx, storetest.WorkerURL(t, b.url), store.PoolConfig{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	t0Secret := attempts["t0"].Secret
	rows, err := pool.Query(b.ctx, `SELECT outcome FROM ledger_reserve_batch($1, '{r,r,r}', '{tenant-a,tenant-a,tenant-a}', $3,
		'{10,10,10}', '{1,1,1}', '{w,w,w}', '{1 minute,1 minute,1 minute}', '{a,b,c}', '{"","",""}', $2, '{f,f,f}')`,
		[]int64{int64(ra.Tasks["t0"]), int64(ra.Tasks["t1"]), int64(ra.Tasks["t1"])},
		[]*string{&t0Secret, &t0Secret, nil}, []int64{attempts["t0"].N, attempts["t1"].N, attempts["t1"].N})
	if err != nil {
		t.Fatal(err)
	}
	outcomes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"ok", "denied", "denied"}; !slices.Equal(outcomes, want) {
		t.Fatalf("t0 with its secret, t1 with t0's, t1 with none: %v, want %v", outcomes, want)
	}
}

// TestCoalescedReservesGetTheirOwnGrants: reserves that a coalescing
// ledger writes with one ledger_reserve_batch each get their own grant
// back. Rounds of concurrent reserves on distinct accounts, each asking
// for its own amount, until a round shows reserves that shared a
// transaction (the same created_at, now()).
func TestCoalescedReservesGetTheirOwnGrants(t *testing.T) {
	t.Parallel()
	b := setup(t)
	limits := make([]int64, 16)
	for i := range limits {
		limits[i] = 1 << 20
	}
	ra := b.openRun(t, "r", 1<<30, 1, limits...)
	beginAttempts(t, b.ledger, ra)
	l := store.NewLedger(b.pool, store.LedgerConfig{Coalesce: true})
	t.Cleanup(l.Close)
	for round := 0; ; round++ {
		if round == 50 {
			t.Fatal("50 rounds of 16 concurrent reserves and none shared a transaction: the batch path was not exercised")
		}
		got := make([]budget.Reservation, len(limits))
		errs := make(chan error, len(limits))
		for i := range limits {
			go func() {
				var err error
				got[i], err = l.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks[fmt.Sprintf("t%d", i)],
					Want: int64(100 + i), Min: 1, Holder: "w", TTL: time.Minute}))
				errs <- err
			}()
		}
		for range limits {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		ids := make([]int64, len(got))
		for i, r := range got {
			if r.AccountID != ra.Tasks[fmt.Sprintf("t%d", i)] || r.Amount != int64(100+i) {
				t.Fatalf("round %d: reserve %d of %d tokens on account %d got %+v", round, i, 100+i, ra.Tasks[fmt.Sprintf("t%d", i)], r)
			}
			ids[i] = int64(r.ID)
		}
		var shared bool
		if err := b.pool.QueryRow(b.ctx, `SELECT count(DISTINCT created_at) < count(*) FROM reservation WHERE reservation_id = ANY ($1)`,
			ids).Scan(&shared); err != nil {
			t.Fatal(err)
		}
		if shared {
			return
		}
	}
}
