package orchestrator

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// driver drives one run on this node: it dispatches ready tasks, hears why
// the run must stop (from its context or the ledger, on any node), and
// ends it. The drive goroutine owns sched, outcomes and running; the
// fields under mu are shared with the watcher and the task goroutines.
type driver struct {
	e        *Engine
	p        *plan
	runID    string
	accounts budget.RunAccounts
	ar       *activeRun
	span     trace.Span // the run span, ended by end
	stopped  stopClock  // when the run was told to stop

	sched    *scheduler
	outcomes []*fanoutv1.TaskOutcome // by dispatch index
	// resumed[i]: task i had not ended when this driver took the run over
	// from a lost orchestrator (nil for a run driven from its start).
	resumed []bool
	// whole[i]: this driver dispatched task i with its whole forecast, not
	// short-started (wound down from its start): the tasks whose spend the
	// tenant's prior may learn from (addPrior). A task that ended before an
	// adoption is not known so, and is left out.
	whole []bool
	// pendingSkips: tasks a resumed run must end SKIPPED first (restore).
	pendingSkips []int
	// timeLeft, if set, is a resumed run's time left (resume.go).
	timeLeft time.Duration
	// epoch is the number of times the run had changed hands when this
	// driver took it (0 for a run it created): its fence when it ends the
	// ledger run (endRun), which another replica's adoption makes stale.
	epoch   int64
	running int
	results chan taskResult
	tasks   sync.WaitGroup
	// fc plans the run's budget (admission by forecast, wind-down); nil
	// under ADMISSION_POLICY_GREEDY.
	fc *forecaster
	// refused counts the tasks the forecast did not start.
	refused int
	// queued: the first wave's TaskQueued events were written with the
	// run (Engine.Submit), not by the driver.
	queued bool
	// sizing: the run's concurrency comes from the rate limits
	// (concurrency.go); nil when it is fixed.
	sizing *sizing
	// begun are the attempts begun with the run (RunAccounts.Attempts), by
	// task index: each task's first try takes its own, once.
	begun map[int]budget.Attempt
	// hedges are how long the tasks that answered ran: the hedged tasks'
	// thresholds (hedge.go).
	hedges peerDurations

	mu         sync.Mutex
	lastBudget time.Time     // when the last BudgetUpdate went out
	exhausted  bool          // the exhaustion was reported (event, drain)
	exhaustion string        // the run account's cause then ("tenant budget exhausted", ...)
	drain      chan struct{} // closed when DRAIN stops new dispatches
	drainOnce  sync.Once

	// children are the tasks (by index) that started a child run
	// (fanout.go).
	children map[int]bool

	// announceMu orders the run's one BudgetExhausted (announceExhaustion)
	// before its end; announced: it was appended, or never will be.
	announceMu sync.Mutex
	announced  bool
}

func newDriver(e *Engine, p *plan, runID string, accounts budget.RunAccounts, ar *activeRun, span trace.Span) *driver {
	n := len(p.spec.GetTasks())
	d := &driver{e: e, p: p, runID: runID, accounts: accounts, ar: ar, span: span,
		sched: newScheduler(p.deps), outcomes: make([]*fanoutv1.TaskOutcome, n), whole: make([]bool, n),
		results: make(chan taskResult, n), drain: make(chan struct{})}
	for i, t := range p.spec.GetTasks() {
		if a, ok := accounts.Attempts[t.GetId()]; ok {
			if d.begun == nil {
				d.begun = map[int]budget.Attempt{}
			}
			d.begun[i] = a
		}
	}
	if p.spec.GetBudget().GetAdmission() != fanoutv1.AdmissionPolicy_ADMISSION_POLICY_GREEDY {
		d.fc = newForecaster(p, accounts.Run.Limit, accounts.Run.Held)
	}
	return d
}

// taskResult is how one dispatched task ended.
type taskResult struct {
	index   int
	outcome *fanoutv1.TaskOutcome
}

// drive runs the run to its end. parent is the run's context, cancelRun
// its cancel (with the cause that stopped it).
func (d *driver) drive(parent context.Context, cancelRun context.CancelCauseFunc) {
	defer d.e.forgetOwn(d.runID, d.ar)
	timeout := d.p.runTimeout
	if d.timeLeft > 0 {
		timeout = d.timeLeft
	}
	runCtx, cancelTimeout := context.WithTimeoutCause(parent, timeout, errRunTimeout)
	defer cancelTimeout()
	defer cancelRun(nil)
	active := metrics().runsActive
	active.Add(runCtx, 1)
	defer active.Add(context.WithoutCancel(runCtx), -1)
	defer context.AfterFunc(runCtx, d.stopped.stop)()
	defer d.listen(runCtx, cancelRun)()
	defer d.tasks.Wait()

	d.schedule(runCtx, cancelRun)
	d.addPrior(runCtx)
	d.end(runCtx)
}

// addPrior adds the run's whole tasks (dispatched by this driver with their
// whole forecast, they ran to an answer, not wound down, not hedged: a
// hedged task spent two attempts) to its tenant's prior for its model, once
// per run: an adopter that ends the run again adds nothing
// (docs/budget.md#priors).
func (d *driver) addPrior(runCtx context.Context) {
	if d.e.priors == nil || d.ar.isLost() {
		return
	}
	var n, spent, peak int64
	for i, o := range d.outcomes {
		if !d.whole[i] {
			continue // short-started, or ended before an adoption
		}
		if o != nil && ranToAnswer(o) && !o.GetSummary().GetWoundDown() && o.GetHedge() == nil {
			n, spent, peak = n+1, spent+o.GetTokensSpent(), peak+max(o.GetSummary().GetPeakTokens(), o.GetTokensSpent())
		}
	}
	if n == 0 {
		return
	}
	ctx, cancel := cleanup(runCtx)
	defer cancel()
	if _, err := d.e.priors.AddTaskPrior(ctx, d.runID, d.p.tenantID, d.p.spec.GetModel().GetModel(), n, spent, peak); err != nil {
		d.e.cfg.Logger.WarnContext(ctx, "add the run's tasks to its tenant's prior", "run_id", d.runID, "err", err)
	}
}

// schedule dispatches tasks as they become ready, up to the run's
// concurrency, until every task has ended.
func (d *driver) schedule(runCtx context.Context, cancelRun context.CancelCauseFunc) {
	d.skip(runCtx, d.pendingSkips)
	d.replayPolicy(cancelRun)
	if d.fc != nil { // a resumed run's ended tasks
		for i, o := range d.outcomes {
			if o == nil {
				continue
			}
			d.fc.ended(i, o.GetTokensSpent(), o.GetSummary().GetPeakTokens(), ranToAnswer(o) && o.GetHedge() == nil) // a hedged task: two attempts
			if o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED {
				d.refused++
			}
		}
	}
	if !d.queued {
		d.queue(runCtx, d.sched.Ready()) // the first wave in one write
	}
	resize, stopResize := d.startSizing(runCtx)
	defer stopResize()
	runDone, drain := runCtx.Done(), (<-chan struct{})(d.drain)
	for d.startReady(runCtx); !d.sched.Done(); d.startReady(runCtx) {
		select {
		case r := <-d.results:
			d.taskEnded(runCtx, r, cancelRun)
			d.resizeAfter(runCtx, r)
		case <-resize:
			d.resize(runCtx, true)
		case <-runDone:
			runDone = nil // startReady ends the queued tasks
		case <-drain:
			drain = nil
		}
	}
}

// startReady starts what may start. Once the run was told to stop (its
// context ended, or DRAIN began) queued tasks end without a dispatch.
func (d *driver) startReady(runCtx context.Context) {
	for d.running < d.p.concurrency || d.stopping(runCtx) {
		i, ok := d.sched.Peek()
		if !ok {
			return
		}
		if d.stopping(runCtx) {
			d.sched.Next()
			d.endUndispatched(runCtx, i, unstarted(d.stopCause(runCtx)))
			d.skip(runCtx, d.sched.Failed(i))
			continue
		}
		verdict := admit
		if d.fc != nil {
			var forecast int64
			var why string
			verdict, forecast, why = d.fc.admit(i)
			switch verdict {
			case hold:
				return // a task in flight ends first
			case refuse:
				if d.fc.setLimit(d.p, d.ledgerLimit()) {
					continue // a continuation raised the run's limit: admit it again
				}
				d.sched.Next()
				d.refused++
				d.announceExhaustion(runCtx, nil) // the budget cannot pay for every task
				d.endUndispatched(runCtx, i, &fanoutv1.TaskOutcome{Status: fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED,
					ForecastTokens: forecast, Summary: &fanoutv1.FactSummary{
						Status: fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED, Error: why}})
				d.skip(runCtx, d.sched.Failed(i))
				d.joinPolicy(d.outcomes[i], d.ar.cancel) // FAIL_FAST: a task that did not succeed
				continue
			}
		}
		d.sched.Next()
		req := d.request(runCtx, i)
		if verdict == short {
			req.WindDownAfter = 1 // one useful iteration, then its answer
		} else {
			d.whole[i] = true
		}
		w := d.e.workers.Next() // here, so that round-robin follows dispatch order
		begun, ok := d.begun[i]
		delete(d.begun, i)
		d.running++
		d.tasks.Add(1)
		go func() {
			defer d.tasks.Done()
			var a *budget.Attempt
			if ok {
				a = &begun
			}
			d.results <- taskResult{index: i, outcome: d.runTask(runCtx, i, w, req, a)}
		}()
	}
}

// taskEnded records a dispatched task's end: its dependents become ready
// or are skipped, and the join policy may stop the run.
func (d *driver) taskEnded(runCtx context.Context, r taskResult, cancelRun context.CancelCauseFunc) {
	d.running--
	d.outcomes[r.index] = r.outcome
	if d.fc != nil {
		d.fc.ended(r.index, r.outcome.GetTokensSpent(), r.outcome.GetSummary().GetPeakTokens(), ranToAnswer(r.outcome))
	}
	st := r.outcome.GetStatus()
	if st == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
		d.queue(runCtx, d.sched.Succeeded(r.index))
	} else {
		d.skip(runCtx, d.sched.Failed(r.index))
	}
	d.joinPolicy(r.outcome, cancelRun)
}

// joinPolicy stops the run if the join policy says o's end stops it.
func (d *driver) joinPolicy(o *fanoutv1.TaskOutcome, cancelRun context.CancelCauseFunc) {
	st := o.GetStatus()
	switch d.p.spec.GetJoinPolicy() {
	case fanoutv1.JoinPolicy_JOIN_POLICY_FAIL_FAST:
		if st != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			cancelRun(&failFastError{taskID: o.GetTaskId(), status: st, reason: o.GetSummary().GetError()})
		}
	case fanoutv1.JoinPolicy_JOIN_POLICY_FIRST_SUCCESS:
		if st == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			cancelRun(errFirstSuccess)
		}
	}
}

// ranToAnswer reports whether a task's spend is what a task costs to its
// end: it answered, or ran all its iterations (here: a task that reused
// recorded facts spent nothing).
func ranToAnswer(o *fanoutv1.TaskOutcome) bool {
	st := o.GetStatus()
	return o.GetSummary().GetIterations() > 0 && o.GetReused() == nil &&
		(st == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED || st == fanoutv1.TaskStatus_TASK_STATUS_ITERATION_LIMIT)
}

// skip ends tasks that wait on one that did not succeed as SKIPPED.
func (d *driver) skip(runCtx context.Context, skipped []int) {
	for _, j := range skipped {
		d.endUndispatched(runCtx, j, &fanoutv1.TaskOutcome{Status: fanoutv1.TaskStatus_TASK_STATUS_SKIPPED})
	}
}

// queue reports tasks that became ready as TaskQueued events, in one write.
func (d *driver) queue(runCtx context.Context, ready []int) {
	if len(ready) == 0 {
		return
	}
	evs := queuedEvents(d.p, ready)
	if d.ar.isLost() {
		return // another replica drives the run and tells its story
	}
	ctx, cancel := cleanup(runCtx)
	defer cancel()
	_, err := d.e.store.AppendEvents(ctx, d.runID, evs)
	d.e.logAppend(ctx, d.runID, err)
	d.e.wake(d.runID)
}

// queuedEvents are the TaskQueued events of plan p's tasks ready.
func queuedEvents(p *plan, ready []int) []*fanoutv1.RunEvent {
	evs := make([]*fanoutv1.RunEvent, len(ready))
	for k, i := range ready {
		evs[k] = &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskQueued{TaskQueued: &fanoutv1.TaskQueued{
			TaskId: p.spec.GetTasks()[i].GetId(), DispatchIndex: int32(i),
		}}}
	}
	return evs
}

// stopping reports whether the run was told to stop: its context ended or
// DRAIN began.
func (d *driver) stopping(runCtx context.Context) bool {
	if runCtx.Err() != nil {
		return true
	}
	select {
	case <-d.drain:
		return true
	default:
		return false
	}
}

// stopCause is why the run stops: its context's cause, or budget
// exhaustion (also under DRAIN, which cancels nothing).
func (d *driver) stopCause(runCtx context.Context) error {
	if d.isExhausted() {
		return budget.ErrExhausted
	}
	return context.Cause(runCtx)
}

// event appends an event, logging a failure: losing one progress event must
// not stop the run.
func (d *driver) event(ctx context.Context, ev *fanoutv1.RunEvent) {
	if d.ar.isLost() {
		return // another replica drives the run and tells its story
	}
	_, err := d.e.appendEvent(ctx, d.runID, ev)
	d.e.logAppend(ctx, d.runID, err)
}

// lose abandons the run when a task write found that another replica
// drives it now (it adopted the run while this one's heartbeat lapsed).
func (d *driver) lose(ctx context.Context, err error) {
	if !d.ar.isLost() {
		d.e.cfg.Logger.ErrorContext(ctx, "another orchestrator adopted a run this one drives; abandoning it",
			"run_id", d.runID, "err", err)
	}
	d.ar.lose()
}

// logAppend logs a failed event append. A run that another replica adopted
// and ended takes no more events: that is expected, not an error.
func (e *Engine) logAppend(ctx context.Context, runID string, err error) {
	switch {
	case errors.Is(err, runs.ErrEnded):
		e.cfg.Logger.InfoContext(ctx, "run ended elsewhere; event dropped", "run_id", runID, "err", err)
	case err != nil:
		e.cfg.Logger.ErrorContext(ctx, "append run event", "run_id", runID, "err", err)
	}
}

// cleanup is a context for the writes that record how a run or task ended:
// detached from the run's cancellation, bounded by cleanupTimeout.
func cleanup(runCtx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(runCtx), cleanupTimeout)
}
