package orchestrator

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// How a run's driver hears that the run's budget ran out, or that it was
// cancelled elsewhere (listen, heard), and acts on it once (onExhausted);
// how it reports the budget as tasks end (reportBudget), and winds tasks
// down when what is left pays only for their answers (windDown).

// listen hears the run's end from any node — exhaustion, or CancelRun
// elsewhere, also after an exhaustion (DRAIN lets calls run on, and a
// cancel must still stop them) — until the returned stop is called.
func (d *driver) listen(runCtx context.Context, cancelRun context.CancelCauseFunc) (stop func()) {
	sub := d.e.watcher.Subscribe(d.runID)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-done:
			return
		case <-sub.Done():
			d.heard(runCtx, sub.Signal(), cancelRun)
		}
		if sub.Signal().State != budget.StateExhausted {
			return
		}
		select {
		case <-done:
		case <-sub.Cancelled():
			d.heard(runCtx, sub.CancelSignal(), cancelRun)
		}
	}()
	return func() {
		close(done)
		wg.Wait()
		sub.Close()
	}
}

// heard acts on what the ledger said of the run's account.
func (d *driver) heard(runCtx context.Context, sig budget.RunSignal, cancelRun context.CancelCauseFunc) {
	switch sig.State {
	case budget.StateExhausted:
		d.onExhausted(runCtx, cancelRun)
	case budget.StateCancelled:
		cause := sig.Cause
		if cause == "" { // a notice carries no cause; the account has it
			ctx, cancel := cleanup(runCtx)
			if acct, err := d.e.ledger.RunAccount(ctx, d.runID); err == nil {
				cause = acct.Cause
			}
			cancel()
		}
		cancelRun(&CancelError{Cause: cmpOr(cause, budget.ErrRunCancelled.Error())})
	}
}

// onExhausted applies the exhaustion policy, once: DRAIN stops new
// dispatches, STOP cancels the run.
func (d *driver) onExhausted(ctx context.Context, cancelRun context.CancelCauseFunc) {
	if !d.markExhausted(ctx) {
		return
	}
	if d.p.spec.GetOnExhaustion() == fanoutv1.ExhaustionPolicy_EXHAUSTION_POLICY_DRAIN {
		d.drainOnce.Do(func() { close(d.drain) })
		return
	}
	cancelRun(budget.ErrExhausted)
}

// markExhausted records the run's exhaustion by the ledger (its account,
// or its tenant's, fell below the minimum reservation) the first time, and
// reports whether this was the first.
func (d *driver) markExhausted(ctx context.Context) bool {
	d.mu.Lock()
	first := !d.exhausted
	d.exhausted = true
	d.mu.Unlock()
	if !first {
		return false
	}
	d.stopped.stop()
	d.span.AddEvent("budget.exhausted")
	cctx, cancel := cleanup(ctx)
	defer cancel()
	var at *budget.Account
	if acct, err := d.e.ledger.RunAccount(cctx, d.runID); err == nil {
		at = &acct
		d.mu.Lock()
		d.exhaustion = acct.Cause
		d.mu.Unlock()
	}
	d.announceExhaustion(cctx, at)
	return true
}

// announceExhaustion appends the run's BudgetExhausted, the one event that
// marks when its budget ran out (docs/budget.md, "When the budget ran
// out"), unless the run's log has it already: from this driver, or from
// the replica this one adopted the run from. acct is the run account at
// that moment (nil: read it now). Whoever comes second waits for the
// first's append, so that the run's end never overtakes it; an append
// that failed leaves the mark to the next caller (settleExhaustion, at the
// latest).
func (d *driver) announceExhaustion(ctx context.Context, acct *budget.Account) {
	d.announceMu.Lock()
	defer d.announceMu.Unlock()
	if d.announced {
		return
	}
	if d.ar.isLost() { // another replica drives the run and tells its story
		d.announced = true
		return
	}
	ctx, cancel := cleanup(ctx)
	defer cancel()
	if d.resumed != nil && d.exhaustionLogged(ctx) {
		d.announced = true
		return
	}
	ev := &fanoutv1.BudgetExhausted{}
	if acct == nil {
		if a, err := d.e.ledger.RunAccount(ctx, d.runID); err == nil {
			acct = &a
		}
	}
	if acct != nil {
		ev.Budget = runs.Snapshot(*acct)
	}
	_, err := d.e.appendEvent(ctx, d.runID, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_BudgetExhausted{BudgetExhausted: ev}})
	d.e.logAppend(ctx, d.runID, err)
	d.announced = err == nil
}

// settleExhaustion closes the run's exhaustion once its state is decided:
// a run that ends BUDGET_EXHAUSTED, or whose budget the ledger said ran out
// (markExhausted may still be reading the account when a cancel or a
// timeout decides another end), is announced now if it was not yet (a
// resumed run whose lost owner's declines are all this driver knows of),
// and nothing is announced after this, so that the mark, if any, comes
// before the RunFinished.
func (d *driver) settleExhaustion(ctx context.Context, state fanoutv1.RunState) {
	if state == fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED || d.isExhausted() {
		d.announceExhaustion(ctx, nil)
	}
	d.announceMu.Lock()
	d.announced = true
	d.announceMu.Unlock()
}

// exhaustionPage is how many events exhaustionLogged reads at once.
const exhaustionPage = 500

// exhaustionLogged reports whether the run's event log holds a
// BudgetExhausted: a resumed run's lost owner may have appended it. It
// reads the log once, when an adopted run runs out; if the log cannot be
// read it reports false (a second mark rather than none).
func (d *driver) exhaustionLogged(ctx context.Context) bool {
	logged := false
	for after := int64(0); ; {
		evs, err := d.e.store.Events(ctx, d.p.tenantID, d.runID, after, exhaustionPage)
		if err != nil {
			d.e.cfg.Logger.WarnContext(ctx, "read the run's events for an earlier BudgetExhausted", "run_id", d.runID, "err", err)
			return false
		}
		for _, ev := range evs {
			switch {
			case ev.GetBudgetExhausted() != nil:
				logged = true
			case ev.GetRunContinued().GetReopened():
				logged = false // that one marked an earlier end (docs/budget.md#continue)
			}
		}
		if len(evs) < exhaustionPage {
			return logged
		}
		after = evs[len(evs)-1].GetSequence()
	}
}

func (d *driver) isExhausted() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.exhausted
}

// exhaustedCause is why the run's budget ran out, as its account says
// ("budget exhausted" for its own, "tenant budget exhausted" for its
// tenant's), or "" if it has not.
func (d *driver) exhaustedCause() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.exhausted {
		return ""
	}
	return cmpOr(d.exhaustion, budget.ErrExhausted.Error())
}

// budgetEvery spaces a run's BudgetUpdate events: without it a wide fan-out
// reads the run account and appends an event for every task that ends.
const budgetEvery = 100 * time.Millisecond

// reportBudget appends a BudgetUpdate with the run account as it is now,
// unless one went out less than budgetEvery ago. The run's end always
// reports the closed account (endRun).
func (d *driver) reportBudget(ctx, runCtx context.Context) {
	d.mu.Lock()
	if time.Since(d.lastBudget) < budgetEvery {
		d.mu.Unlock()
		return
	}
	d.lastBudget = time.Now()
	d.mu.Unlock()
	acct, err := d.e.ledger.RunAccount(ctx, d.runID)
	if err != nil {
		d.e.cfg.Logger.WarnContext(ctx, "read run budget", "run_id", d.runID, "err", err)
		return
	}
	d.event(ctx, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_BudgetUpdate{BudgetUpdate: &fanoutv1.BudgetUpdate{Budget: runs.Snapshot(acct)}}})
	if acct.State == budget.StateExhausted {
		// The ledger said so before the watcher did; act now.
		d.onExhausted(runCtx, d.ar.cancel)
	}
}

// windDown marks tasks (dispatch indexes) as wound down in the ledger:
// every grant on their accounts from now on says so, and each makes the
// iteration it asked for its last.
func (d *driver) windDown(ctx context.Context, tasks []int) {
	ids := make([]string, len(tasks))
	for k, i := range tasks {
		ids[k] = d.p.spec.GetTasks()[i].GetId()
	}
	d.span.AddEvent("budget.wind_down")
	err := d.e.ledger.WindDown(ctx, d.runID, d.epoch, ids)
	switch {
	case errors.Is(err, budget.ErrDenied):
		d.lose(ctx, err)
	case err != nil:
		d.e.cfg.Logger.WarnContext(ctx, "wind down run; its tasks run on until the budget stops them", "run_id", d.runID, "err", err)
	default:
		d.e.cfg.Logger.InfoContext(ctx, "tasks wound down: what is left pays only for their final answers",
			"run_id", d.runID, "tasks", ids)
	}
}
