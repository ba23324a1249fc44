package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/runs"
)

// Spending reads a tenant's spend in money for the API (GetSpend): the
// tenant_spend_money_daily and run_spend_money views, which price every
// settled and expired ledger entry at its model's price of the day.
type Spending struct {
	db
}

// SpendingConfig tunes a Spending.
type SpendingConfig struct {
	// Logger receives a warning for every retried database error. Default
	// slog.Default().
	Logger *slog.Logger
}

// NewSpending returns the spend reader on pool tuned by cfg (at most one;
// none: the zero SpendingConfig). A node's is Stores.Spending, on the API
// pool.
func NewSpending(pool *Pool, config ...SpendingConfig) *Spending {
	return &Spending{db: newDB(pool, configOf(config).Logger)}
}

// The bounds of a spend report.
const (
	// MaxSpendDays is the longest range of days one report covers.
	MaxSpendDays = 366
	// MaxSpendRuns is the most runs one report names.
	MaxSpendRuns = 200
)

// Report returns tenantID's spend per UTC day from fromDay to toDay
// (YYYY-MM-DD, inclusive; "" to: today by the database's clock; "" from:
// 30 days before to), and the spend of runIDs (at most MaxSpendRuns) of
// that tenant: another tenant's run has none. A range it refuses (from
// after to, longer than MaxSpendDays, as the database resolves the
// defaults) or too many runs is a *runs.SpendRangeError.
func (s *Spending) Report(ctx context.Context, tenantID, fromDay, toDay string, runIDs []string) (runs.SpendReport, error) {
	if tenantID == "" {
		return runs.SpendReport{}, errors.New("spend report: tenant id is empty")
	}
	if len(runIDs) > MaxSpendRuns {
		return runs.SpendReport{}, &runs.SpendRangeError{Field: "run_ids", Why: fmt.Sprintf("at most %d runs, got %d", MaxSpendRuns, len(runIDs))}
	}
	var rep runs.SpendReport
	err := retried(ctx, s.log, "spend.report", idempotent, func(ctx context.Context, _ try) error {
		rep = runs.SpendReport{}
		var from, to string
		var days int
		// Days are resolved by the database: its clock, its calendar.
		err := s.pool.QueryRow(ctx, `
			WITH r AS (SELECT coalesce(nullif($2, '')::date, (now() AT TIME ZONE 'UTC')::date) AS t)
			SELECT coalesce(nullif($1, '')::date, t - 30)::text, t::text, t - coalesce(nullif($1, '')::date, t - 30)
			  FROM r`, fromDay, toDay).Scan(&from, &to, &days)
		if err != nil {
			return err
		}
		if days < 0 {
			return &runs.SpendRangeError{Field: "from_day", Why: fmt.Sprintf("%s is after to_day %s", from, to)}
		} else if days >= MaxSpendDays {
			return &runs.SpendRangeError{Field: "from_day", Why: fmt.Sprintf("the range is %d days; at most %d", days+1, MaxSpendDays)}
		}
		rep.FromDay, rep.ToDay = from, to
		// tenant_spend_money_daily's rows of those days, aggregated here from
		// money_line with a range on created_at, which the index
		// ledger_entry_tenant_time serves (the view's day is computed, so a
		// filter on it would read the tenant's whole journal).
		rows, err := s.pool.Query(ctx, `
			SELECT (created_at AT TIME ZONE 'UTC')::date::text AS day, coalesce(currency, ''),
			       coalesce(sum(cost), 0)::text,
			       coalesce(sum(cost) FILTER (WHERE NOT worst_case), 0)::text,
			       coalesce(sum(cost) FILTER (WHERE worst_case), 0)::text,
			       coalesce(sum(tokens) FILTER (WHERE cost IS NOT NULL), 0),
			       coalesce(sum(tokens) FILTER (WHERE cost IS NOT NULL AND worst_case), 0),
			       coalesce(sum(tokens) FILTER (WHERE cost IS NULL), 0),
			       count(DISTINCT run_id)
			  FROM money_line
			 WHERE tenant_id = $1
			   AND created_at >= ($2::date)::timestamp AT TIME ZONE 'UTC'
			   AND created_at < ($3::date + 1)::timestamp AT TIME ZONE 'UTC'
			 GROUP BY 1, 2
			 ORDER BY 1, 2 NULLS FIRST`, tenantID, from, to)
		if err != nil {
			return err
		}
		rep.Days, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (runs.DaySpend, error) {
			var d runs.DaySpend
			err := r.Scan(&d.Day, &d.Currency, &d.Cost, &d.ReportedCost, &d.WorstCaseCost,
				&d.PricedTokens, &d.WorstCaseTokens, &d.UnpricedTokens, &d.Runs)
			return d, err
		})
		if err != nil || len(runIDs) == 0 {
			return err
		}
		rows, err = s.pool.Query(ctx, `
			SELECT run_id, coalesce(currency, ''), cost::text, reported_cost::text, worst_case_cost::text,
			       priced_tokens, worst_case_tokens, unpriced_tokens
			  FROM run_spend_money
			 WHERE tenant_id = $1 AND run_id = ANY($2::text[])
			 ORDER BY run_id, currency NULLS FIRST`, tenantID, runIDs)
		if err != nil {
			return err
		}
		rep.Runs, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (runs.RunSpend, error) {
			var d runs.RunSpend
			err := r.Scan(&d.RunID, &d.Currency, &d.Cost, &d.ReportedCost, &d.WorstCaseCost,
				&d.PricedTokens, &d.WorstCaseTokens, &d.UnpricedTokens)
			return d, err
		})
		return err
	})
	if err != nil {
		if _, ok := errors.AsType[*runs.SpendRangeError](err); ok {
			return runs.SpendReport{}, err
		}
		return runs.SpendReport{}, fmt.Errorf("spend report of tenant %s: %w", tenantID, err)
	}
	return rep, nil
}

// PriceTokens prices tokens of model at its price in effect now (of rows
// from one instant, the latest set, as money_line picks), each token at the
// higher of its input and output price: the worst case the spend views
// price a spend at when its split is not known. A quote is such a spend
// (docs/budget.md#quotes). One line per currency; none when the model has
// no price.
func (s *Spending) PriceTokens(ctx context.Context, model string, tokens int64) ([]runs.Spend, error) {
	var out []runs.Spend
	err := retried(ctx, s.log, "spend.price_tokens", idempotent, func(ctx context.Context, _ try) error {
		rows, err := s.pool.Query(ctx, `
			SELECT currency, trim_scale($2::numeric * greatest(input_per_million, output_per_million) / 1000000)::text
			  FROM price
			 WHERE model = $1 AND effective_from <= now()
			 ORDER BY effective_from DESC, set_at DESC
			 LIMIT 1`, model, tokens)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (runs.Spend, error) {
			l := runs.Spend{PricedTokens: tokens, WorstCaseTokens: tokens}
			err := r.Scan(&l.Currency, &l.Cost)
			l.WorstCaseCost = l.Cost
			return l, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("price %d tokens of model %s: %w", tokens, model, err)
	}
	return out, nil
}
