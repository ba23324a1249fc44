package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// A run ends the same way whether this engine drove it or adopted it from a
// lost replica (lease.go): endRun waits for the reservations still held,
// closes the ledger run (its spend is the run's total), and writes the end.

// runEnd says how a run ends.
type runEnd struct {
	state fanoutv1.RunState
	cause string
	// ledgerCause, if set, cancels the ledger run first with this cause, so
	// that every worker stops what it still runs for it (shutdown, adoption).
	ledgerCause string
	// result is called once the run holds no reservation (or HeldWait
	// passed) and returns the joined result; an error leaves the run
	// RUNNING, to be adopted and ended again.
	result func(ctx context.Context) (*fanoutv1.JoinedResult, error)
	// epoch is the owner epoch of the engine ending the run (driver.epoch,
	// or the adoption's): the ledger run is cancelled and closed only while
	// the run has not changed hands since, so an owner that lost the run
	// ends nothing of it.
	epoch int64
}

// fencedOut reports, after a fenced ledger write was denied, that another
// replica took the run over: this engine abandons it.
func (e *Engine) fencedOut(ctx context.Context, runID string, err error) bool {
	if !errors.Is(err, budget.ErrDenied) {
		return false
	}
	e.cfg.Logger.ErrorContext(ctx, "another orchestrator took over a run this one was ending; abandoning it",
		"run_id", runID, "err", err)
	e.mu.Lock()
	if ar := e.active[runID]; ar != nil {
		ar.lose()
	}
	e.mu.Unlock()
	return true
}

// endRun ends the run as end says, from a context detached from parent's
// cancellation. It returns the closed ledger account (nil if it could not
// be closed), the result, and whether this engine ended the run (false if
// another replica had).
func (e *Engine) endRun(parent context.Context, runID string, end runEnd) (closed *budget.Account, result *fanoutv1.JoinedResult, ended bool) {
	if end.ledgerCause != "" {
		ctx, cancel := cleanup(parent)
		_, err := e.ledger.EndRunFenced(ctx, runID, budget.StateCancelled, end.ledgerCause, end.epoch)
		if e.fencedOut(ctx, runID, err) {
			cancel()
			return nil, nil, false
		}
		if err != nil && !errors.Is(err, budget.ErrNotFound) { // it died before opening the accounts
			e.cfg.Logger.ErrorContext(ctx, "cancel ledger run", "run_id", runID, "err", err)
		}
		cancel()
	}
	e.awaitHeld(parent, runID)
	// The wait can outlast a cleanup context (HeldWait is longer): what
	// follows, which must be written, gets a fresh one.
	ctx, cancel := cleanup(parent)
	defer cancel()
	result, err := end.result(ctx)
	if err != nil {
		e.cfg.Logger.ErrorContext(ctx, "join run", "run_id", runID, "err", err)
		return nil, nil, false
	}
	// One write: the ledger run closed (the ledger is the truth: its spend
	// also counts calls cut off before their worker could report, settled
	// at their full reservation, and becomes the result's total), the
	// final BudgetUpdate that followers' budget views end with, and the end.
	closing, err := e.store.CloseRun(ctx, runID, e.cfg.Node, end.epoch, end.state, end.cause, result)
	if e.fencedOut(ctx, runID, err) {
		return nil, nil, false
	}
	return closing.Account, result, e.finished(ctx, runID, end.state, closing, err)
}

// awaitHeld waits, up to Config.HeldWait (less on a forced shutdown), until
// the run holds no reservation (what its tasks' slices hold unreserved is
// not one). Every task (and synthesis) has ended by now, so a reservation
// still held belongs to a worker that is still settling or lost its task
// (killed, cut off) and may have paid for its call. CloseRun never voids
// it: a run that still holds reservations is cancelled and closes when the
// last one is settled or posted by the sweeper as estimated spend. Waiting
// here lets the run's total be final when RunFinished is written; a worker
// that is alive settles before it reports, so this is normally one read.
func (e *Engine) awaitHeld(parent context.Context, runID string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), e.cfg.HeldWait)
	defer cancel()
	tick := time.NewTicker(e.cfg.WatchPollInterval)
	defer tick.Stop()
	for failures := 0; ; {
		acct, err := e.ledger.RunAccount(ctx, runID)
		switch {
		case errors.Is(err, budget.ErrNotFound) || err == nil && acct.Reserved-acct.Sliced == 0:
			return
		case err != nil:
			if failures++; failures >= 3 { // the ledger cannot tell us; do not guess
				e.cfg.Logger.WarnContext(ctx, "cannot read the run's reservations", "run_id", runID, "err", err)
				return
			}
		}
		select {
		case <-ctx.Done():
			e.cfg.Logger.WarnContext(ctx, "run ends with reservations still held", "run_id", runID,
				"reserved", acct.Reserved, "waited", e.cfg.HeldWait)
			return
		case <-e.base.Done(): // forced shutdown: stop waiting
			return
		case <-tick.C:
		}
	}
}

// finished reports what CloseRun said of ending the run as state: whether
// this engine ended it, with its metrics if it did, and, first, its end
// handed to this node's followers of the run: the closing events, durable
// now, go to them without a read of the log (their Run and WatchRun
// streams send the RunFinished at once; followers on other nodes find it
// by their poll). A run that another replica adopted (or that ended
// otherwise) is left as it is: its RunFinished is the other's to append.
// If the write failed the run stays RUNNING; once this engine stops
// heartbeating it, it is adopted and ended.
func (e *Engine) finished(ctx context.Context, runID string, state fanoutv1.RunState, closing runs.Closing, err error) bool {
	if err != nil {
		e.cfg.Logger.ErrorContext(ctx, "finish run", "run_id", runID, "err", err)
		return false
	}
	stored := closing.Run
	if !closing.Ended {
		e.cfg.Logger.WarnContext(ctx, "run ended elsewhere; not ending it here", "run_id", runID,
			"state", runs.Text(stored.GetState()), "cause", stored.GetCancelCause())
		return false
	}
	e.followers.publish(runID, closing.Events) // the RunFinished is stored with the end
	byState := metric.WithAttributes(attrRunState.String(runs.Text(state)))
	metrics().runsFinished.Add(context.WithoutCancel(ctx), 1, byState)
	if stored.GetCreatedAt() != nil && stored.GetFinishedAt() != nil {
		metrics().runDuration.Record(context.WithoutCancel(ctx),
			stored.GetFinishedAt().AsTime().Sub(stored.GetCreatedAt().AsTime()).Seconds(), byState)
	}
	return true
}

// end is the end of a run this engine drove, once every task has ended:
// decide its state from why it stopped, join, synthesize, and end it.
func (d *driver) end(runCtx context.Context) {
	if d.ar.isLost() {
		// Another replica adopted the run and resumes it: its end is theirs.
		d.e.cfg.Logger.WarnContext(runCtx, "run abandoned to the orchestrator that adopted it", "run_id", d.runID)
		endRunSpan(d.span, fanoutv1.RunState_RUN_STATE_RUNNING, errRunLost.Error(), errRunLost, nil, nil)
		return
	}
	d.recordStopLatency(runCtx)
	runCause := d.finalCause(runCtx)
	exhausted := d.exhaustedCause()
	if exhausted == "" && d.refused > 0 {
		// The budget could not pay for every task: it ran out, by forecast.
		exhausted = fmt.Sprintf("budget exhausted: %d of %d tasks not started, by forecast", d.refused, len(d.outcomes))
	}
	state, cause := runState(d.p, runCause, exhausted, d.outcomes)
	d.settleExhaustion(runCtx, state)
	d.countDiscarded(runCtx, runCause)
	result := join(d.outcomes)
	if d.p.spec.GetSynthesize() {
		result.Synthesis, result.SynthesisSkippedReason = d.synthesize(runCtx, runCause, result)
	}
	end := runEnd{state: state, cause: cause, epoch: d.epoch,
		result: func(context.Context) (*fanoutv1.JoinedResult, error) { return result, nil }}
	if errors.Is(context.Cause(runCtx), errShutdown) {
		end.ledgerCause = cause
	}
	// Synthesis is waited for like every task: its call may still be
	// settling. Then close the ledger, so that whoever sees RunFinished
	// reads final spend.
	closed, result, ended := d.e.endRun(runCtx, d.runID, end)
	if ended && d.p.tree.parentRunID != "" {
		ctx, cancel := cleanup(runCtx)
		d.e.childEnded(ctx, d.runID, state, result)
		cancel()
	}
	if ended {
		d.e.cfg.Logger.InfoContext(runCtx, "run ended", "run_id", d.runID, "state", runs.Text(state), "cause", cause,
			"tasks", len(d.outcomes), "tokens", result.GetTotalTokens())
	}
	endRunSpan(d.span, state, cause, runCause, result, closed)
}

// finalCause is why the run stopped, read once every task has ended: the
// run context's cause, else what the ledger says. Workers hear a CancelRun
// through the ledger as fast as this node's watcher does, so every task
// can end CANCELLED before the run context hears it; and the last settle
// can exhaust the budget before the notice arrives.
func (d *driver) finalCause(runCtx context.Context) error {
	runCause := context.Cause(runCtx) // before drive's deferred cancelRun(nil)
	ctx, cancel := cleanup(runCtx)
	defer cancel()
	acct, err := d.e.ledger.RunAccount(ctx, d.runID)
	if err != nil {
		return runCause
	}
	switch {
	case acct.State == budget.StateExhausted:
		d.markExhausted(ctx)
	case runCause == nil && acct.State == budget.StateCancelled:
		runCause = &CancelError{Cause: cmpOr(acct.Cause, budget.ErrRunCancelled.Error())}
	}
	return runCause
}

// recordStopLatency records how long the run took to stop once told to.
func (d *driver) recordStopLatency(runCtx context.Context) {
	took, ok := d.stopped.since()
	if !ok {
		return
	}
	stopCause := context.Cause(runCtx)
	reason := cancelReason(stopCause)
	if stopCause == nil {
		reason = "budget_exhausted" // DRAIN: stopped without a cancel
	}
	metrics().cancelLatency.Record(context.WithoutCancel(runCtx), took.Seconds(),
		metric.WithAttributes(attrCancelScope.String("run"), attrCancelReason.String(reason)))
}

// countDiscarded adds to the speculation bill what the tasks a join policy
// cancelled had spent: the price of running them in parallel.
func (d *driver) countDiscarded(runCtx context.Context, runCause error) {
	var ff *failFastError
	if !errors.Is(runCause, errFirstSuccess) && !errors.As(runCause, &ff) {
		return
	}
	var tokens int64
	for _, o := range d.outcomes {
		if o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_CANCELLED {
			tokens += o.GetTokensSpent()
		}
	}
	metrics().tokensDiscarded.Add(context.WithoutCancel(runCtx), tokens,
		metric.WithAttributes(attrJoinPolicy.String(runs.Text(d.p.spec.GetJoinPolicy()))))
}
