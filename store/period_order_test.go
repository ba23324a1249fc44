package store_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
)

// TestSpendCountsInThePeriodItIsPostedIn: a tenant budget of 1,000 tokens
// every 3 s and a reservation of 300 granted before the period's end, then
// every order of what can follow it across the end (docs/runs.md "Tenant
// budgets": periods in database time; ledger_settle: "spend posted after
// the period's end counts in the next period"). Whatever statement is the
// first one after the end — a reserve, a settle, the sweeper's expiry, a
// void — spend posted after the end counts in the new period and spend
// posted before it in the old one, the same in the tenant's account
// (PeriodSpent), in tenant_period_spend and in the conservation check.
func TestSpendCountsInThePeriodItIsPostedIn(t *testing.T) {
	t.Parallel()
	const period = 3 * time.Second
	type want struct{ first, second int64 }
	for _, tc := range []struct {
		name string
		// before runs before the period's end, after once it has passed.
		before, after func(t *testing.T, b *testBundle, ra budget.RunAccounts, r budget.Reservation)
		ttl           time.Duration
		want          want
	}{
		{
			name: "settled before the end",
			before: func(t *testing.T, b *testBundle, _ budget.RunAccounts, r budget.Reservation) {
				settle(t, b, r, 200, false)
			},
			after: func(t *testing.T, b *testBundle, ra budget.RunAccounts, _ budget.Reservation) {
				reserveSettle(t, b, ra, 100)
			},
			want: want{200, 100},
		},
		{
			name: "settled after the end, first",
			after: func(t *testing.T, b *testBundle, ra budget.RunAccounts, r budget.Reservation) {
				settle(t, b, r, 200, false)
				reserveSettle(t, b, ra, 100)
			},
			want: want{0, 300},
		},
		{
			name: "settled after a reserve after the end",
			after: func(t *testing.T, b *testBundle, ra budget.RunAccounts, r budget.Reservation) {
				s := reserve(t, b, ra, 100)
				settle(t, b, r, 200, false)
				settle(t, b, s, 100, false)
			},
			want: want{0, 300},
		},
		{
			name: "overrun settled after the end, first",
			after: func(t *testing.T, b *testBundle, _ budget.RunAccounts, r budget.Reservation) {
				settle(t, b, r, 450, false)
			},
			want: want{0, 450},
		},
		{
			name: "expired after the end, first",
			ttl:  time.Second,
			after: func(t *testing.T, b *testBundle, ra budget.RunAccounts, _ budget.Reservation) {
				if n, err := b.ledger.ExpireLeases(b.ctx); err != nil || n != 1 {
					t.Fatalf("ExpireLeases = %d, %v; want the one lease that ran out", n, err)
				}
				reserveSettle(t, b, ra, 100)
			},
			want: want{0, 400},
		},
		{
			name: "voided after the end, first",
			after: func(t *testing.T, b *testBundle, ra budget.RunAccounts, r budget.Reservation) {
				if _, err := b.ledger.Void(b.ctx, r.ID, r.Lease.Generation, ""); err != nil {
					t.Fatal(err)
				}
				// The whole period limit is there to be granted.
				reserveSettle(t, b, ra, 1000)
			},
			want: want{0, 1000},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ten := b.setBudget(t, budget.TenantBudget{TenantID: "acme", Limit: 1000,
				Period: budget.Period{Kind: budget.PeriodEvery, Every: period}})
			ra := b.openTenantRun(t, ten, "order", 100_000, 1)
			lease := ttl
			if tc.ttl != 0 {
				lease = tc.ttl
			}
			r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["x"], Want: 300, Min: 300, Holder: "n", TTL: lease}))
			if err != nil {
				t.Fatal(err)
			}
			if tc.before != nil {
				tc.before(t, b, ra, r)
			}
			if b.periodEnded(t, ten) {
				t.Fatalf("the period of %v ended before the first part of the test was done: the machine is too slow for this test's period", period)
			}
			b.waitPeriodEnd(t, ten)
			if tc.ttl != 0 {
				b.waitLeaseEnd(t, r)
			}
			tc.after(t, b, ra, r)

			got, err := b.ledger.TenantAccount(b.ctx, "acme")
			if err != nil {
				t.Fatal(err)
			}
			if got.PeriodSpent != tc.want.second || got.Reserved != 0 {
				t.Errorf("tenant account = %+v; want %d spent this period and nothing held", got, tc.want.second)
			}
			if av := got.Available(); av != 1000-tc.want.second {
				t.Errorf("tenant available = %d; want the period's 1000 less the %d spent in it", av, tc.want.second)
			}
			if p := b.periodSpend(t, "acme"); len(p) != 2 || p[0] != tc.want.first || p[1] != tc.want.second {
				t.Errorf("tenant_period_spend = %v; want [%d %d]", p, tc.want.first, tc.want.second)
			}
			b.checkConserved(t)
		})
	}
}

func reserve(t *testing.T, b *testBundle, ra budget.RunAccounts, n int64) budget.Reservation {
	t.Helper()
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["x"], Want: n, Min: n, Holder: "n", TTL: ttl}))
	if err != nil {
		t.Fatalf("reserve %d: %v", n, err)
	}
	return r
}

func settle(t *testing.T, b *testBundle, r budget.Reservation, actual int64, estimated bool) {
	t.Helper()
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r.ID, Generation: r.Lease.Generation, Actual: actual, Estimated: estimated}); err != nil {
		t.Fatalf("settle %d of reservation %d: %v", actual, r.ID, err)
	}
}

func reserveSettle(t *testing.T, b *testBundle, ra budget.RunAccounts, n int64) {
	t.Helper()
	settle(t, b, reserve(t, b, ra, n), n, false)
}

// periodEnded reports, in database time, whether ten's period has ended.
func (b *testBundle) periodEnded(t *testing.T, ten budget.TenantAccount) bool {
	t.Helper()
	var passed bool
	if err := b.pool.QueryRow(b.ctx, "SELECT now() >= $1::timestamptz", ten.PeriodEnd).Scan(&passed); err != nil {
		t.Fatal(err)
	}
	return passed
}

// waitPeriodEnd polls the database clock until ten's period has ended.
func (b *testBundle) waitPeriodEnd(t *testing.T, ten budget.TenantAccount) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !b.periodEnded(t, ten) {
		if time.Now().After(deadline) {
			t.Fatalf("the period did not end within %v", patience)
		}
		time.Sleep(50 * time.Millisecond) // polling the database clock
	}
}

// waitLeaseEnd polls the database clock until r's lease has run out.
func (b *testBundle) waitLeaseEnd(t *testing.T, r budget.Reservation) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		var passed bool
		if err := b.pool.QueryRow(b.ctx, "SELECT now() >= lease_expires_at FROM reservation WHERE reservation_id = $1", int64(r.ID)).Scan(&passed); err != nil {
			t.Fatal(err)
		}
		if passed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lease of reservation %d did not end within %v", r.ID, patience)
		}
		time.Sleep(50 * time.Millisecond) // polling the database clock
	}
}

// periodSpend returns what tenant_period_spend says tenant spent in each
// of its periods, oldest first.
func (b *testBundle) periodSpend(t *testing.T, tenant string) []int64 {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT spent_tokens FROM tenant_period_spend WHERE tenant_id = $1 ORDER BY period_start`, tenant)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return got
}
