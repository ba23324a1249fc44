package orchestrator

import (
	"context"
	"errors"
	"fmt"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// QuotePricer prices a forecast in money at the prices the operator set
// (store.Spending implements it).
type QuotePricer interface {
	// PriceTokens prices tokens of model at its price in effect now, each
	// token at the higher of its input and output price (the worst case,
	// as the spend views price a spend whose split is not known): one line
	// per currency, none when the model has no price.
	PriceTokens(ctx context.Context, model string, tokens int64) ([]runs.Spend, error)
}

// quoteRun prices a run of plan p before it runs (docs/budget.md#quotes),
// from the forecast admission uses: limit is the run's budget (a
// continuation's, after the addition); ended[i], when set, is how task i
// already ended (a continuation's tasks that will not run again; their
// peaks inform the forecast as a running run's do); notRun holds the lines
// of the tasks that will not run (reused or ended), with their reasons,
// filled in by the caller. Every other task runs and is forecast here.
//
// p must have been through checkTenant (the prior and the tenant's account
// are read there) and sizeFirst. A price that cannot be read leaves the
// quote without money rather than failing it: the tokens are the quote.
func (e *Engine) quoteRun(ctx context.Context, p *plan, limit int64, ended []*fanoutv1.TaskOutcome,
	notRun map[int]*fanoutv1.TaskQuote) (*fanoutv1.Quote, error) {
	f := newForecaster(p, limit, p.synthesisHeld)
	basis := "token_budget"
	if p.prior.tasks > 0 {
		basis = "prior"
	}
	for i, o := range ended {
		if o != nil {
			f.ended(i, o.GetTokensSpent(), o.GetSummary().GetPeakTokens(),
				o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED ||
					o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_ITERATION_LIMIT)
		}
	}
	if f.answered > 0 {
		basis = "run"
	}
	q := &fanoutv1.Quote{LimitTokens: limit, SynthesisTokens: p.synthesisHeld, Basis: basis}
	// Admission in dispatch order: a task starts when what the tasks may
	// still claim covers its forecast, and the tasks after it wait for it.
	left, admitting := f.left(), true
	for i, t := range p.spec.GetTasks() {
		if line := notRun[i]; line != nil {
			line.TaskId, line.DispatchIndex, line.Runs = t.GetId(), int32(i), false
			q.Tasks = append(q.Tasks, line)
			continue
		}
		n := f.need(i)
		q.Tasks = append(q.Tasks, &fanoutv1.TaskQuote{TaskId: t.GetId(), DispatchIndex: int32(i), Runs: true,
			ForecastTokens: n})
		q.TasksTokens += n
		if admitting = admitting && n <= left; admitting {
			q.AdmittedTasks++
			left -= n
		}
	}
	q.ForecastTokens = q.TasksTokens + q.SynthesisTokens
	// A tenant without a budget covers any run; an exhausted one, none.
	q.TenantCovers = true
	if p.tenantAccount != 0 {
		q.TenantBudget, q.TenantAvailableTokens = true, p.tenantAvailable
		q.TenantCovers = !p.tenantExhausted && p.tenantAvailable >= quoteHold(q)
	}
	if pr, ok := e.spend.(QuotePricer); ok && p.spec.GetModel().GetModel() != "" {
		lines, err := pr.PriceTokens(ctx, p.spec.GetModel().GetModel(), q.ForecastTokens)
		if err != nil {
			e.cfg.Logger.WarnContext(ctx, "price a quote; it is given in tokens only", "tenant_id", p.tenantID,
				"model", p.spec.GetModel().GetModel(), "err", err)
		}
		for _, l := range lines {
			q.Cost = append(q.Cost, spendProto(l))
		}
	}
	return q, nil
}

// quoteHold is what a run quoted q may take of its tenant's budget as
// forecast: its forecast, no more than its limit.
func quoteHold(q *fanoutv1.Quote) int64 { return min(q.GetForecastTokens(), q.GetLimitTokens()) }

// quote answers a dry run of spec (StartRunRequest.dry_run): the spec
// validated as Submit validates it, the tenant's quotas applied, and its
// quote; nothing is written. A tenant whose budget is spent is not an
// error here: the quote says it does not cover the run.
func (e *Engine) quote(ctx context.Context, spec *fanoutv1.RunSpec) (*fanoutv1.Quote, error) {
	p, err := e.cfg.callerPlan(known(spec))
	if err != nil {
		return nil, err
	}
	if err := e.checkTenant(ctx, p, false); err != nil && !errors.Is(err, ErrTenantExhausted) {
		return nil, err
	}
	e.sizeFirst(ctx, p)
	q, err := e.quoteRun(ctx, p, p.spec.GetBudget().GetLimitTokens(), nil, nil)
	if err != nil {
		return nil, fmt.Errorf("quote a run of tenant %s: %w", p.tenantID, err)
	}
	return q, nil
}

// QuoteNotCoveredError is a run started with reserve_quote refused because
// its tenant's available tokens do not cover what its quote may take of
// them, min(forecast, limit) (docs/budget.md#quotes). It is
// ErrTenantExhausted.
type QuoteNotCoveredError struct {
	Tenant string
	Quote  *fanoutv1.Quote
}

func (e *QuoteNotCoveredError) Error() string {
	q := e.Quote
	return fmt.Sprintf("tenant %s's budget: %d tokens available do not cover the quote's %d (min of forecast %d and run limit %d)",
		e.Tenant, q.GetTenantAvailableTokens(), quoteHold(q), q.GetForecastTokens(), q.GetLimitTokens())
}

func (e *QuoteNotCoveredError) Unwrap() error { return ErrTenantExhausted }

// reserveQuote quotes the run of plan p that reserve_quote asked for, and
// refuses it (*QuoteNotCoveredError) when its tenant's budget does not
// cover the quote. The check is at admission, against what the tenant had
// available when p was planned: the forecast is not held for the run, and
// the quote says so (held is false).
func (e *Engine) reserveQuote(ctx context.Context, p *plan) (*fanoutv1.Quote, error) {
	q, err := e.quoteRun(ctx, p, p.spec.GetBudget().GetLimitTokens(), nil, nil)
	if err != nil {
		return nil, fmt.Errorf("quote a run of tenant %s: %w", p.tenantID, err)
	}
	if !q.GetTenantCovers() {
		return q, &QuoteNotCoveredError{Tenant: p.tenantID, Quote: q}
	}
	return q, nil
}
