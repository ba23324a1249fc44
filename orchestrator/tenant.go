package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/tenant"
)

// TenantStore reads a tenant's quotas. store.Runs implements it.
type TenantStore interface {
	TenantQuotas(ctx context.Context, tenantID string) (tenant.Quotas, error)
}

// TaskPriors keeps, per tenant and model, what whole tasks cost in
// earlier runs (docs/budget.md#priors). store.Runs implements it.
type TaskPriors interface {
	// TaskPrior returns the sums over tasks, zero if there are none.
	TaskPrior(ctx context.Context, tenantID, model string) (tasks, spent, peak int64, err error)
	// AddTaskPrior adds run runID's whole tasks to them, once per run
	// (added false: they were added before).
	AddTaskPrior(ctx context.Context, runID, tenantID, model string, tasks, spent, peak int64) (added bool, err error)
}

// prior is what a tenant's whole tasks cost with a model in earlier runs:
// how many, and their spend and peaks in all.
type prior struct{ tasks, spent, peak int64 }

// readPrior records on p what its tenant's tasks cost with its model in
// earlier runs, read once as the run starts. A prior is a hint: without
// one (none kept, or the read failed) the forecast rests on the tasks'
// token_budgets.
func (e *Engine) readPrior(ctx context.Context, p *plan) {
	if e.priors == nil {
		return
	}
	n, spent, peak, err := e.priors.TaskPrior(ctx, p.tenantID, p.spec.GetModel().GetModel())
	if err != nil {
		e.cfg.Logger.WarnContext(ctx, "read the tenant's task prior; the run's first tasks are forecast from their token_budget",
			"tenant_id", p.tenantID, "err", err)
		return
	}
	p.prior = prior{tasks: n, spent: spent, peak: peak}
}

// TaskSlots bounds a tenant's tasks in flight across the fleet: a
// counting semaphore in the database (store.Semaphore), so replicas share
// it and a dead holder's slot frees itself when its lease runs out.
type TaskSlots interface {
	// Hold waits for one of limit slots of key, runs fn holding it
	// (renewed), and frees it when fn returns. It returns fn's error, or
	// the reason no slot was had (ctx ended, the database refused).
	Hold(ctx context.Context, holder, key string, limit int, fn func(ctx context.Context) error) error
}

// ErrTenantExhausted is a run refused because its tenant's budget for the
// current period is spent.
var ErrTenantExhausted = fmt.Errorf("tenant budget exhausted: %w", budget.ErrExhausted)

// tenantSlotKey is the semaphore key of a tenant's tasks in flight.
func tenantSlotKey(tenantID string) string { return "tenant-tasks:" + tenantID }

// checkTenant applies the tenant's quotas and budget to a planned run before
// anything is written: a run budget over the tenant's max_run_tokens is
// RESOURCE_EXHAUSTED naming the field, a tenant whose budget cannot grant
// its minimum is ErrTenantExhausted. It records on p what the driver needs
// (the tenant's account, its cap on tasks in flight). The cap on
// concurrent runs is the store's, under a lock (CreateRun).
//
// An adopted run was admitted once: resumed, it only learns the tenant's
// cap on tasks in flight.
func (e *Engine) checkTenant(ctx context.Context, p *plan, resumed bool) error {
	if e.tenants != nil {
		q, err := e.tenants.TenantQuotas(ctx, p.tenantID)
		if err != nil {
			return fmt.Errorf("read the quotas of tenant %s: %w", p.tenantID, err)
		}
		if q.MaxTasksInFlight != nil {
			p.maxTasksInFlight = int(*q.MaxTasksInFlight)
		}
		if q.Headroom != nil && p.autoConcurrency {
			p.headroom = *q.Headroom
		}
		if limit := p.spec.GetBudget().GetLimitTokens(); !resumed && q.MaxRunTokens != nil && limit > *q.MaxRunTokens {
			var v validator
			v.overCap("spec.budget.limit_tokens", "must be at most %d (tenant %s's max_run_tokens), got %d",
				*q.MaxRunTokens, p.tenantID, limit)
			return v.err()
		}
	}
	e.readPrior(ctx, p)
	// A resumed run opens its accounts again (OpenRun is idempotent, and
	// creates them if its first owner died before it did): under its
	// tenant's account, whatever that tenant has left.
	return e.tenantAccount(ctx, p, !resumed)
}

// tenantAccount finds the tenant's ledger account, if it has a budget, and
// records it on p; with check, a tenant that cannot grant its minimum now
// is ErrTenantExhausted.
func (e *Engine) tenantAccount(ctx context.Context, p *plan, check bool) error {
	tl, ok := e.ledger.(budget.TenantLedger)
	if !ok {
		return nil
	}
	ta, err := tl.TenantAccount(ctx, p.tenantID)
	switch {
	case errors.Is(err, budget.ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("read the budget of tenant %s: %w", p.tenantID, err)
	}
	p.tenantAccount, p.tenantAvailable, p.tenantExhausted = ta.ID, max(ta.Available(), 0), ta.Exhausted()
	if check && ta.Available() < ta.MinReservation {
		if !ta.PeriodEnd.IsZero() {
			return fmt.Errorf("%w: %d of %d tokens left in the period that ends %s", ErrTenantExhausted,
				max(ta.Available(), 0), ta.PeriodLimit, ta.PeriodEnd.UTC().Format(time.RFC3339))
		}
		return fmt.Errorf("%w: %d tokens left", ErrTenantExhausted, max(ta.Available(), 0))
	}
	return nil
}

// holdTaskSlot runs do holding one of the tenant's task slots when the
// tenant caps its tasks in flight, else runs it. A task that never got a
// slot ends as a task that never started does.
func (d *driver) holdTaskSlot(ctx context.Context, taskID string, do func(ctx context.Context) *fanoutv1.TaskOutcome) *fanoutv1.TaskOutcome {
	if d.p.maxTasksInFlight <= 0 || d.e.slots == nil {
		return do(ctx)
	}
	var o *fanoutv1.TaskOutcome
	holder := d.e.cfg.Node + "/" + d.runID + "/" + taskID
	// Each level of a tree of child runs has a share of its own
	// (docs/budget.md#nested-fan-out): a task at depth d takes a slot while
	// fewer than (d+1) × the cap are held, counting every level's. A
	// parent waiting for its child holds its slot, and its child's tasks
	// still find one: the deepest level never waits for another.
	limit := d.p.maxTasksInFlight * int(d.p.tree.depth+1)
	err := d.e.slots.Hold(ctx, holder, tenantSlotKey(d.p.tenantID), limit, func(ctx context.Context) error {
		o = do(ctx)
		return nil
	})
	switch {
	case o != nil:
		return o
	case ctx.Err() != nil:
		return unstarted(context.Cause(ctx)) // it never ran
	}
	return failedOutcome(fmt.Sprintf("no slot of tenant %s's max_tasks_in_flight (%d): %v",
		d.p.tenantID, d.p.maxTasksInFlight, err))
}
