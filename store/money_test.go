package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// TestSpendInMoney: settle entries carry the model and the provider's
// split, expire entries the reservation's model; the money views price a
// known split exactly at the price in effect when the entry was written,
// price estimated spend (no split) at the higher of the model's two
// prices, and count tokens of a model with no price as unpriced; every
// view carries tenant_id and the auditor reads them; SetPrice logs to
// admin_action and refuses bad input without writing.
func TestSpendInMoney(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var dbNow time.Time
	if err := b.pool.QueryRow(b.ctx, "SELECT now()").Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	finance := storetest.Actor(t, b.pool)
	for _, p := range []store.SetPriceParams{
		{Actor: finance, Model: "m-a", EffectiveFrom: dbNow.Add(-2 * time.Hour), InputPerMillion: "1", OutputPerMillion: "1", Reason: "history"},
		{Actor: finance, Model: "m-a", EffectiveFrom: dbNow.Add(-time.Hour), InputPerMillion: "3", OutputPerMillion: "15", Reason: "history"},
		{Actor: finance, Model: "m-a", EffectiveFrom: dbNow.Add(time.Hour), InputPerMillion: "100", OutputPerMillion: "100"},
	} {
		if _, err := store.NewAudit(b.pool).SetPrice(b.ctx, p); err != nil {
			t.Fatalf("set price %+v: %v", p, err)
		}
	}
	var logged int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM admin_action WHERE action IN ('price.set', 'price.correct') AND actor = $1", finance).Scan(&logged); err != nil || logged != 3 {
		t.Errorf("price.set and price.correct actions logged = %d, %v; want 3", logged, err)
	}
	for _, p := range []store.SetPriceParams{
		{Actor: finance, Model: "m-a", EffectiveFrom: dbNow, InputPerMillion: "-1", OutputPerMillion: "1"},
		{Actor: finance, Model: "m-a", EffectiveFrom: dbNow, InputPerMillion: "1", OutputPerMillion: "1", Currency: "usd"},
		{Actor: "", Model: "m-a", EffectiveFrom: dbNow, InputPerMillion: "1", OutputPerMillion: "1"},
	} {
		if _, err := store.NewAudit(b.pool).SetPrice(b.ctx, p); !errors.Is(err, budget.ErrInvalid) {
			t.Errorf("SetPrice(%+v) = %v; want a validation error", p, err)
		}
	}
	if n := b.count(t, "price"); n != 3 {
		t.Errorf("price rows = %d after refused changes; want 3", n)
	}

	ra := b.openRun(t, "money", 100_000, 1, 50_000, 50_000)
	t0, t1 := ra.Tasks["t0"], ra.Tasks["t1"]
	reserve := func(acct budget.AccountID, want int64, model string, lease time.Duration) budget.Reservation {
		t.Helper()
		r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: acct, Want: want, Min: want, Holder: "n", TTL: lease, Model: model}))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	settle := func(r budget.Reservation, p budget.SettleParams) {
		t.Helper()
		p.Reservation, p.Generation = r.ID, r.Lease.Generation
		if _, err := b.ledger.Settle(b.ctx, p); err != nil {
			t.Fatalf("settle %+v: %v", p, err)
		}
	}
	// Reported with its split: 1000 in at 3, 200 out at 15 = 0.006.
	settle(reserve(t0, 2000, "m-a", ttl), budget.SettleParams{Actual: 1200, InputTokens: 1000, OutputTokens: 200})
	// Estimated, no split: 500 at the higher price, 15 = 0.0075.
	settle(reserve(t0, 500, "m-a", ttl), budget.SettleParams{Actual: 500, Estimated: true})
	// Expired: 100 at 15 = 0.0015, priced by the reservation's model.
	expiring := reserve(t0, 100, "m-a", time.Second)
	// No price for m-b: 300 tokens unpriced.
	settle(reserve(t1, 300, "m-b", ttl), budget.SettleParams{Actual: 300, InputTokens: 100, OutputTokens: 200})
	// A split that does not add up is refused before anything is written.
	bad := reserve(t1, 10, "m-a", ttl)
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: bad.ID, Generation: 1, Actual: 10, InputTokens: 5, OutputTokens: 4}); !errors.Is(err, budget.ErrInvalid) {
		t.Errorf("settle with a split of 9 for actual 10: err = %v, want a validation error", err)
	}
	if _, err := b.ledger.Void(b.ctx, bad.ID, 1, ""); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(patience)
	for {
		n, err := b.ledger.ExpireLeases(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reservation %d did not expire within %v", expiring.ID, patience)
		}
		time.Sleep(100 * time.Millisecond) // polling the sweeper
	}

	var model string
	var in, out int64
	if err := b.pool.QueryRow(b.ctx, `SELECT model, input_tokens, output_tokens FROM ledger_entry
		WHERE kind = 'settle' AND actual = 1200`).Scan(&model, &in, &out); err != nil || model != "m-a" || in != 1000 || out != 200 {
		t.Errorf("settle entry: model %q, split %d/%d, %v; want m-a 1000/200", model, in, out, err)
	}
	var expModel *string
	if err := b.pool.QueryRow(b.ctx, "SELECT model FROM ledger_entry WHERE kind = 'expire'").Scan(&expModel); err != nil || expModel == nil || *expModel != "m-a" {
		t.Errorf("expire entry model = %v, %v; want m-a", expModel, err)
	}

	type money struct {
		Key                           string
		Currency                      *string
		Cost, Reported, Worst         string
		Priced, WorstTokens, Unpriced int64
	}
	asAuditor := func(sql string) []money {
		t.Helper()
		var rows []money
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(b.ctx, "SET LOCAL ROLE fanout_auditor"); err != nil {
				return err
			}
			r, err := tx.Query(b.ctx, sql)
			if err != nil {
				return err
			}
			rows, err = pgx.CollectRows(r, func(row pgx.CollectableRow) (money, error) {
				var m money
				return m, row.Scan(&m.Key, &m.Currency, &m.Cost, &m.Reported, &m.Worst, &m.Priced, &m.WorstTokens, &m.Unpriced)
			})
			return err
		})
		if err != nil {
			t.Fatalf("as fanout_auditor: %s: %v", sql, err)
		}
		return rows
	}
	const cols = `currency, trim_scale(cost)::text, trim_scale(reported_cost)::text, trim_scale(worst_case_cost)::text,
		priced_tokens, worst_case_tokens, unpriced_tokens`
	check := func(view string, got []money, want []money) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s = %+v; want %d rows", view, got, len(want))
		}
		for i := range want {
			g, w := got[i], want[i]
			if g.Key != w.Key || (g.Currency == nil) != (w.Currency == nil) || (g.Currency != nil && *g.Currency != *w.Currency) ||
				g.Cost != w.Cost || g.Reported != w.Reported || g.Worst != w.Worst ||
				g.Priced != w.Priced || g.WorstTokens != w.WorstTokens || g.Unpriced != w.Unpriced {
				t.Errorf("%s row %d = %+v (currency %v)\nwant %+v (currency %v)", view, i, g, val(g.Currency), w, val(w.Currency))
			}
		}
	}
	usd := "USD"
	check("run_spend_money", asAuditor(`SELECT tenant_id || '/' || run_id, `+cols+`
		FROM run_spend_money WHERE run_id = 'money' ORDER BY currency NULLS LAST`), []money{
		{"tenant-a/money", &usd, "0.015", "0.006", "0.009", 1800, 600, 0},
		{"tenant-a/money", nil, "0", "0", "0", 0, 0, 300},
	})
	check("task_spend_money", asAuditor(`SELECT tenant_id || '/' || task_id, `+cols+`
		FROM task_spend_money WHERE run_id = 'money' ORDER BY task_id, currency NULLS LAST`), []money{
		{"tenant-a/t0", &usd, "0.015", "0.006", "0.009", 1800, 600, 0},
		{"tenant-a/t1", nil, "0", "0", "0", 0, 0, 300},
	})
	check("tenant_spend_money_daily", asAuditor(`SELECT tenant_id, `+cols+`
		FROM tenant_spend_money_daily WHERE tenant_id = 'tenant-a' ORDER BY currency NULLS LAST`), []money{
		{"tenant-a", &usd, "0.015", "0.006", "0.009", 1800, 600, 0},
		{"tenant-a", nil, "0", "0", "0", 0, 0, 300},
	})
	b.checkConserved(t)
}

func val[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
