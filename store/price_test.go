package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// TestPricesAreAppendOnly (issue 23, item 5): a price effective in the
// past is a correction — refused without a reason, and with one a new row
// beside the one it corrects, logged as price.correct naming what it
// supersedes; spend is priced at the correction from then on. No row of
// price can be updated or deleted, even by the owner.
func TestPricesAreAppendOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var dbNow time.Time
	if err := b.pool.QueryRow(b.ctx, "SELECT now()").Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	actor := storetest.Actor(t, b.pool)
	from := dbNow.Add(-time.Hour)
	set := func(in, out, reason string) error {
		_, err := store.NewAudit(b.pool).SetPrice(b.ctx, store.SetPriceParams{Actor: actor, Model: "m-a", EffectiveFrom: from,
			InputPerMillion: in, OutputPerMillion: out, Reason: reason})
		return err
	}
	var verr *budget.ValidationError
	if err := set("2", "2", ""); !errors.As(err, &verr) || !strings.Contains(err.Error(), "reason") {
		t.Errorf("a price effective an hour ago without a reason: %v; want a validation error naming the reason", err)
	}
	if n := b.count(t, "price"); n != 0 {
		t.Fatalf("price rows after a refused set = %d; want 0", n)
	}
	if err := set("2", "2", "launch price, entered late"); err != nil {
		t.Fatal(err)
	}
	ra := b.openRun(t, "priced", 100_000, 1, 100_000)
	r, err := b.ledger.Reserve(b.ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 2000, Min: 2000, Holder: "n", TTL: ttl, Model: "m-a"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Settle(b.ctx, budget.SettleParams{Reservation: r.ID, Generation: r.Lease.Generation,
		Actual: 1000, InputTokens: 500, OutputTokens: 500}); err != nil {
		t.Fatal(err)
	}
	cost := func() string {
		t.Helper()
		var c string
		if err := b.pool.QueryRow(b.ctx, `SELECT cost::text FROM money_line WHERE run_id = 'priced'`).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	before := cost()
	if err := set("0", "0", "vendor credit: this model was free for the hour"); err != nil {
		t.Fatal(err)
	}
	var rows, corrections int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*), count(*) FILTER (WHERE reason LIKE 'vendor credit%') FROM price WHERE model = 'm-a'`).Scan(&rows, &corrections); err != nil || rows != 2 || corrections != 1 {
		t.Errorf("price rows of m-a = %d (%d corrections), %v; want the first and its correction", rows, corrections, err)
	}
	var logged int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM admin_action WHERE action = 'price.correct'
		AND detail->'supersedes'->>'input_per_million' = '2' AND detail->>'reason' LIKE 'vendor credit%'`).Scan(&logged); err != nil || logged != 1 {
		t.Errorf("price.correct actions naming what they supersede = %d, %v; want 1", logged, err)
	}
	var zero bool
	if err := b.pool.QueryRow(b.ctx, `SELECT cost = 0 FROM money_line WHERE run_id = 'priced'`).Scan(&zero); err != nil || !zero {
		t.Errorf("money_line after the correction: cost is zero = %v, %v (it was %s); want the corrected price", zero, err, before)
	}
	for _, sql := range []string{
		`UPDATE price SET input_per_million = 99`,
		`DELETE FROM price`,
		`TRUNCATE price`,
	} {
		_, err := b.pool.Exec(b.ctx, sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s as the owner: %v; want insufficient_privilege", sql, err)
		}
	}
	if n := b.count(t, "price"); n != 2 {
		t.Errorf("price rows = %d; want 2, untouched", n)
	}
}
