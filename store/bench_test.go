package store_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// BenchmarkHotAccount measures reserve+settle pairs per second on ONE run
// account with 1, 16 and 64 concurrent clients, beside a raw baseline in the
// same run: the bare conditional single-row UPDATE + INSERT per operation,
// through pgx, with no ledger logic. The ratio is printed in a table at the end.
//
// The tenant variants put a tenant account (a daily budget, issue 14) above
// the runs: each client drives its own run of one tenant, so the only row
// they share is the tenant's, which every reserve and settle of the tenant
// locks. "runs" is the same clients on their own runs with no tenant
// account: tenant/runs is what the shared tenant row costs.
func BenchmarkHotAccount(b *testing.B) {
	type result struct {
		ledger, coalesced, raw, ledgerP99, coalescedP99, rawP99               float64
		tenant, tenantCoalesced, runs, tenantP99, tenantCoalescedP99, runsP99 float64
		sliced, slicedCoalesced, slicedP99, slicedCoalescedP99                float64
	}
	results := map[int]*result{}
	clientsList := []int{1, 16, 64}
	for _, clients := range clientsList {
		results[clients] = &result{}
		for _, coalesce := range []bool{false, true} {
			name := "ledger"
			if coalesce {
				name = "coalesced"
			}
			b.Run(fmt.Sprintf("%s/clients=%d", name, clients), func(b *testing.B) {
				ctx := context.Background()
				pool := benchPool(b, clients)
				l := store.NewLedger(pool, store.LedgerConfig{Coalesce: coalesce})
				defer l.Close()
				ra, err := l.OpenRun(ctx, budget.OpenRunParams{RunID: "hot", TenantID: "bench", Limit: 1 << 50, MinReservation: 1,
					Tasks: []budget.TaskBudget{{TaskID: "t", Limit: 1 << 50}}})
				if err != nil {
					b.Fatal(err)
				}
				acct := ra.Tasks["t"]
				attempt, err := l.BeginAttempt(ctx, acct, "hot", "bench")
				if err != nil {
					b.Fatal(err)
				}
				rate, p99 := benchClients(b, clients, func() error {
					r, err := l.Reserve(ctx, budget.ReserveParams{Account: acct, RunID: "hot", TenantID: "bench", Attempt: attempt.N, Secret: attempt.Secret,
						Want: 1000, Min: 1, Holder: "bench", TTL: time.Minute})
					if err != nil {
						return err
					}
					_, err = l.Settle(ctx, budget.SettleParams{Reservation: r.ID, Generation: r.Lease.Generation, Actual: 700})
					return err
				})
				if coalesce {
					results[clients].coalesced, results[clients].coalescedP99 = rate, p99
				} else {
					results[clients].ledger, results[clients].ledgerP99 = rate, p99
				}
			})
		}
		for _, v := range []struct {
			name             string
			tenant, coalesce bool
			rate, p99        *float64
		}{
			{"tenant", true, false, &results[clients].tenant, &results[clients].tenantP99},
			{"tenant-coalesced", true, true, &results[clients].tenantCoalesced, &results[clients].tenantCoalescedP99},
			{"runs", false, false, &results[clients].runs, &results[clients].runsP99},
		} {
			b.Run(fmt.Sprintf("%s/clients=%d", v.name, clients), func(b *testing.B) {
				*v.rate, *v.p99 = benchTenant(b, clients, v.tenant, v.coalesce)
			})
		}
		for _, coalesce := range []bool{false, true} {
			rate, p99 := &results[clients].sliced, &results[clients].slicedP99
			name := "sliced"
			if coalesce {
				rate, p99, name = &results[clients].slicedCoalesced, &results[clients].slicedCoalescedP99, "sliced-coalesced"
			}
			b.Run(fmt.Sprintf("%s/clients=%d", name, clients), func(b *testing.B) {
				*rate, *p99 = benchSliced(b, clients, coalesce)
			})
		}
		b.Run(fmt.Sprintf("raw/clients=%d", clients), func(b *testing.B) {
			ctx := context.Background()
			pool := benchPool(b, clients)
			if _, err := pool.Exec(ctx, `CREATE TABLE hot (id int PRIMARY KEY, lim bigint, reserved bigint, spent bigint);
				CREATE TABLE hot_log (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, delta bigint, at timestamptz DEFAULT now());
				INSERT INTO hot VALUES (1, 1::bigint << 50, 0, 0)`); err != nil {
				b.Fatal(err)
			}
			const op = `WITH u AS (UPDATE hot SET reserved = reserved + $1, spent = spent + $2
				WHERE id = 1 AND reserved + spent + $1 + $2 <= lim RETURNING id)
				INSERT INTO hot_log (delta) SELECT $1 FROM u`
			rate, p99 := benchClients(b, clients, func() error {
				if _, err := pool.Exec(ctx, op, int64(1000), int64(0)); err != nil {
					return err
				}
				_, err := pool.Exec(ctx, op, int64(-1000), int64(700))
				return err
			})
			results[clients].raw, results[clients].rawP99 = rate, p99
		})
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "clients\tledger pairs/s\tp99 ms\tcoalesced pairs/s\tp99 ms\traw pairs/s\tp99 ms\tledger/raw\tcoalesced/raw\t")
	for _, c := range clientsList {
		r := results[c]
		if r.raw == 0 {
			continue
		}
		fmt.Fprintf(w, "%d\t%.0f\t%.1f\t%.0f\t%.1f\t%.0f\t%.1f\t%.2f\t%.2f\t\n", c, r.ledger, r.ledgerP99,
			r.coalesced, r.coalescedP99, r.raw, r.rawP99, r.ledger/r.raw, r.coalesced/r.raw)
	}
	_ = w.Flush()
	w = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "clients\ttenant pairs/s\tp99 ms\ttenant coalesced pairs/s\tp99 ms\truns pairs/s\tp99 ms\ttenant/runs\ttenant/ledger\ttenant coalesced/coalesced\t")
	for _, c := range clientsList {
		r := results[c]
		if r.runs == 0 || r.ledger == 0 || r.coalesced == 0 {
			continue
		}
		fmt.Fprintf(w, "%d\t%.0f\t%.1f\t%.0f\t%.1f\t%.0f\t%.1f\t%.2f\t%.2f\t%.2f\t\n", c, r.tenant, r.tenantP99,
			r.tenantCoalesced, r.tenantCoalescedP99, r.runs, r.runsP99, r.tenant/r.runs, r.tenant/r.ledger,
			r.tenantCoalesced/r.coalesced)
	}
	_ = w.Flush()
	w = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "clients\tsliced pairs/s\tp99 ms\tsliced coalesced pairs/s\tp99 ms\traw pairs/s\tsliced/raw\tsliced coalesced/raw\tsliced coalesced/tenant coalesced\t")
	for _, c := range clientsList {
		r := results[c]
		if r.raw == 0 || r.tenantCoalesced == 0 {
			continue
		}
		fmt.Fprintf(w, "%d\t%.0f\t%.1f\t%.0f\t%.1f\t%.0f\t%.2f\t%.2f\t%.2f\t\n", c, r.sliced, r.slicedP99,
			r.slicedCoalesced, r.slicedCoalescedP99, r.raw, r.sliced/r.raw, r.slicedCoalesced/r.raw,
			r.slicedCoalesced/r.tenantCoalesced)
	}
	_ = w.Flush()
}

// benchSliced runs reserve+settle pairs with one sliced task per client,
// all tasks of one run under one tenant account (docs/ledger.md#budget-slices):
// one tenant with many subagents in flight. Each task's slice pays for its
// calls, so a pair locks the task's row alone; pairs/s and p99 ms of a pair.
func benchSliced(b *testing.B, clients int, coalesce bool) (rate, p99ms float64) {
	ctx := context.Background()
	pool := benchPool(b, clients)
	l := store.NewLedger(pool, store.LedgerConfig{Coalesce: coalesce})
	defer l.Close()
	ten, err := l.SetTenantBudget(ctx, budget.TenantBudget{TenantID: "bench", Limit: 1 << 50, Actor: storetest.Actor(b, pool),
		Period: budget.Period{Kind: budget.PeriodDay}})
	if err != nil {
		b.Fatal(err)
	}
	p := budget.OpenRunParams{RunID: "hot", TenantID: "bench", TenantAccount: ten.ID, Limit: 1 << 50, MinReservation: 1}
	for i := range clients {
		p.Tasks = append(p.Tasks, budget.TaskBudget{TaskID: fmt.Sprintf("t%d", i), Limit: 1 << 40, Slice: 1 << 40})
	}
	ra, err := l.OpenRun(ctx, p)
	if err != nil {
		b.Fatal(err)
	}
	pairs := make([]func() error, clients)
	for i := range pairs {
		acct := ra.Tasks[fmt.Sprintf("t%d", i)]
		attempt, err := l.BeginAttempt(ctx, acct, "hot", "bench")
		if err != nil {
			b.Fatal(err)
		}
		pairs[i] = benchPair(l, acct, "hot", attempt)
	}
	return benchClientsEach(b, pairs)
}

// benchPair is one client's pair: a reserve of 1,000 on acct, settled
// at 700 (500 in, 200 out).
func benchPair(l *store.Ledger, acct budget.AccountID, run string, attempt budget.Attempt) func() error {
	ctx := context.Background()
	return func() error {
		r, err := l.Reserve(ctx, budget.ReserveParams{Account: acct, RunID: run, TenantID: "bench", Attempt: attempt.N, Secret: attempt.Secret,
			Want: 1000, Min: 1, Holder: "bench", TTL: time.Minute, Model: "bench-model"})
		if err != nil {
			return err
		}
		_, err = l.Settle(ctx, budget.SettleParams{Reservation: r.ID, Generation: r.Lease.Generation, Actual: 700,
			InputTokens: 500, OutputTokens: 200})
		return err
	}
}

// benchTenant runs reserve+settle pairs with one run per client, all under
// one tenant account when tenant is set, and reports pairs/s and p99 ms.
func benchTenant(b *testing.B, clients int, tenant, coalesce bool) (rate, p99ms float64) {
	ctx := context.Background()
	pool := benchPool(b, clients)
	l := store.NewLedger(pool, store.LedgerConfig{Coalesce: coalesce})
	defer l.Close()
	var parent budget.AccountID
	if tenant {
		ten, err := l.SetTenantBudget(ctx, budget.TenantBudget{TenantID: "bench", Limit: 1 << 50, Actor: storetest.Actor(b, pool),
			Period: budget.Period{Kind: budget.PeriodDay}})
		if err != nil {
			b.Fatal(err)
		}
		parent = ten.ID
	}
	type task struct {
		run     string
		acct    budget.AccountID
		attempt budget.Attempt
	}
	tasks := make([]task, clients)
	for i := range tasks {
		run := fmt.Sprintf("hot-%d", i)
		ra, err := l.OpenRun(ctx, budget.OpenRunParams{RunID: run, TenantID: "bench", TenantAccount: parent, Limit: 1 << 50,
			MinReservation: 1, Tasks: []budget.TaskBudget{{TaskID: "t", Limit: 1 << 50}}})
		if err != nil {
			b.Fatal(err)
		}
		attempt, err := l.BeginAttempt(ctx, ra.Tasks["t"], run, "bench")
		if err != nil {
			b.Fatal(err)
		}
		tasks[i] = task{run: run, acct: ra.Tasks["t"], attempt: attempt}
	}
	pairs := make([]func() error, clients)
	for i := range pairs {
		tk := tasks[i]
		pairs[i] = benchPair(l, tk.acct, tk.run, tk.attempt)
	}
	return benchClientsEach(b, pairs)
}

func benchPool(b *testing.B, clients int) *pgxpool.Pool {
	b.Helper()
	url := storetest.NewDB(b)
	pool, err := store.Open(context.Background(), fmt.Sprintf("%s&pool_max_conns=%d", url, clients))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// benchClients runs b.N pairs spread over clients goroutines and reports the
// pairs per second and the p99 latency of a pair in milliseconds.
func benchClients(b *testing.B, clients int, pair func() error) (rate, p99ms float64) {
	b.Helper()
	pairs := make([]func() error, clients)
	for c := range pairs {
		pairs[c] = pair
	}
	return benchClientsEach(b, pairs)
}

// benchClientsEach is benchClients with one goroutine per pair function.
func benchClientsEach(b *testing.B, pairs []func() error) (rate, p99ms float64) {
	b.Helper()
	clients := len(pairs)
	var next atomic.Int64
	lat := make([][]time.Duration, clients)
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	start := time.Now()
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				if err := pairs[c](); err != nil {
					failed.Store(err)
					return
				}
				lat[c] = append(lat[c], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	rate = float64(b.N) / elapsed.Seconds()
	if len(all) > 0 {
		p99ms = float64(all[len(all)*99/100]) / float64(time.Millisecond)
	}
	b.ReportMetric(rate, "pairs/s")
	b.ReportMetric(p99ms, "p99-ms")
	return rate, p99ms
}
