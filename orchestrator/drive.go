package orchestrator

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

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
	// begun are the attempts begun with the run (RunAccounts.Attempts), by
	// task index: each task's first try takes its own, once.
	begun map[int]budget.Attempt

	mu         sync.Mutex
	lastBudget time.Time     // when the last BudgetUpdate went out
	exhausted  bool          // the exhaustion was reported (event, drain)
	exhaustion string        // the run account's cause then ("tenant budget exhausted", ...)
	drain      chan struct{} // closed when DRAIN stops new dispatches
	drainOnce  sync.Once
}

func newDriver(e *Engine, p *plan, runID string, accounts budget.RunAccounts, ar *activeRun, span trace.Span) *driver {
	n := len(p.spec.GetTasks())
	d := &driver{e: e, p: p, runID: runID, accounts: accounts, ar: ar, span: span,
		sched: newScheduler(p.deps), outcomes: make([]*fanoutv1.TaskOutcome, n),
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
	defer d.e.forget(d.runID)
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
	d.end(runCtx)
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
			d.fc.ended(i, o.GetTokensSpent(), o.GetSummary().GetPeakTokens(), ranToAnswer(o))
			if o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED {
				d.refused++
			}
		}
	}
	if !d.queued {
		d.queue(runCtx, d.sched.Ready()) // the first wave in one write
	}
	runDone, drain := runCtx.Done(), (<-chan struct{})(d.drain)
	for d.startReady(runCtx); !d.sched.Done(); d.startReady(runCtx) {
		select {
		case r := <-d.results:
			d.taskEnded(runCtx, r, cancelRun)
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
		if d.fc != nil {
			verdict, forecast, why := d.fc.admit(i)
			switch verdict {
			case hold:
				return // a task in flight ends first
			case refuse:
				d.sched.Next()
				d.refused++
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
// end: it answered, or ran all its iterations.
func ranToAnswer(o *fanoutv1.TaskOutcome) bool {
	st := o.GetStatus()
	return o.GetSummary().GetIterations() > 0 &&
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

// endUndispatched records task i, which ends as o says without being
// dispatched (it never ran: at most a NOT_STARTED summary says why).
func (d *driver) endUndispatched(runCtx context.Context, i int, o *fanoutv1.TaskOutcome) {
	ctx, cancel := cleanup(runCtx)
	defer cancel()
	o.TaskId, o.DispatchIndex = d.p.spec.GetTasks()[i].GetId(), int32(i)
	if d.resumed != nil && d.resumed[i] { // the lost orchestrator's attempt may have spent
		o.TokensSpent = d.settledSpend(ctx, d.accounts.Tasks[o.GetTaskId()])
		startedBefore(o)
	}
	d.outcomes[i] = d.finishTask(ctx, o)
}

// startedBefore corrects the outcome o of a resumed task that this driver
// never started, once what it spent is known: if the lost orchestrator's
// attempt spent on it, it had started there, and the budget that stopped
// it here cut it off (BUDGET_EXHAUSTED), so it is not NOT_STARTED, which
// says nothing was spent on it.
func startedBefore(o *fanoutv1.TaskOutcome) {
	if o.GetTokensSpent() > 0 && o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED {
		o.Status, o.Summary = fanoutv1.TaskStatus_TASK_STATUS_BUDGET_EXHAUSTED, nil
	}
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

// markExhausted records the run's exhaustion (a BudgetExhausted event) the
// first time, and reports whether this was the first.
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
	ev := &fanoutv1.BudgetExhausted{}
	if acct, err := d.e.ledger.RunAccount(cctx, d.runID); err == nil {
		ev.Budget = runs.Snapshot(acct)
		d.mu.Lock()
		d.exhaustion = acct.Cause
		d.mu.Unlock()
	}
	d.event(cctx, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_BudgetExhausted{BudgetExhausted: ev}})
	return true
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

// finishTask persists a task's terminal outcome and reports it.
func (d *driver) finishTask(ctx context.Context, o *fanoutv1.TaskOutcome) *fanoutv1.TaskOutcome {
	stored, err := d.e.store.FinishTask(ctx, d.runID, d.e.cfg.Node, o)
	if errors.Is(err, runs.ErrNotOwner) {
		d.lose(ctx, err)
		return o
	}
	if errors.Is(err, runs.ErrEnded) {
		// The replica that adopted the run ended the task; its outcome stands.
		d.e.cfg.Logger.InfoContext(ctx, "task ended elsewhere", "run_id", d.runID, "task_id", o.GetTaskId(), "err", err)
		return o
	}
	if err != nil {
		d.e.cfg.Logger.ErrorContext(ctx, "finish task", "run_id", d.runID, "task_id", o.GetTaskId(), "err", err)
		stored = o
	}
	countTask(ctx, stored)
	d.e.wake(d.runID) // its TaskFinished is stored with it
	return stored
}

// countTask counts a task that ended, and how long it ran if a worker
// started it.
func countTask(ctx context.Context, o *fanoutv1.TaskOutcome) {
	ctx = context.WithoutCancel(ctx)
	status := metric.WithAttributes(attrTaskStatus.String(runs.Text(o.GetStatus())))
	metrics().tasksFinished.Add(ctx, 1, status)
	if o.GetStartedAt() != nil && o.GetFinishedAt() != nil {
		metrics().taskDuration.Record(ctx, o.GetFinishedAt().AsTime().Sub(o.GetStartedAt().AsTime()).Seconds(), status)
	}
}

// request builds the dispatch of task i; its dependencies' facts (all
// succeeded) go along as context.
func (d *driver) request(runCtx context.Context, i int) *fanoutv1.Dispatch {
	spec := d.p.spec
	task := proto.CloneOf(spec.GetTasks()[i])
	task.MaxIterations = d.p.iterations[i]
	timeout := d.p.taskTimeouts[i]
	if dl, ok := runCtx.Deadline(); ok {
		timeout = max(time.Millisecond, min(timeout, time.Until(dl)))
	}
	task.Timeout = durationpb.New(timeout)
	var facts []*fanoutv1.Fact
	index := map[string]int{}
	for _, dep := range d.p.deps[i] {
		facts = mergeFacts(facts, index, d.outcomes[dep].GetSummary().GetFacts())
	}
	return &fanoutv1.Dispatch{
		RunId:                d.runID,
		TenantId:             d.p.tenantID,
		Task:                 task,
		Goal:                 spec.GetGoal(),
		TaskAccountId:        int64(d.accounts.Tasks[task.GetId()]),
		MinReservationTokens: d.p.minReservation,
		Model:                spec.GetModel(),
		OnExhaustion:         spec.GetOnExhaustion(),
		ContextFacts:         facts,
	}
}

// runTask dispatches task i (to first, then others while they refuse it),
// persists its outcome and reports the run's budget.
func (d *driver) runTask(runCtx context.Context, i int, first Worker, req *fanoutv1.Dispatch,
	begun *budget.Attempt) *fanoutv1.TaskOutcome {
	taskCtx, cancel := context.WithTimeoutCause(runCtx, req.GetTask().GetTimeout().AsDuration(), errTaskTimeout)
	defer cancel()

	o := d.holdTaskSlot(taskCtx, req.GetTask().GetId(), func(ctx context.Context) *fanoutv1.TaskOutcome {
		c := d.newDispatch(first, req, taskProgress{d: d, index: i, taskID: req.GetTask().GetId()})
		if !d.stopping(runCtx) {
			// Not once the run was told to stop while this task waited (for
			// a tenant slot): its dispatch asks the ledger, which says why.
			c.begun = begun
		}
		return c.run(ctx)
	})
	o.TaskId, o.DispatchIndex = req.GetTask().GetId(), int32(i)
	o.ForecastTokens = d.fc.forecastOf(i)

	ctx, cancelCleanup := cleanup(runCtx)
	defer cancelCleanup()
	if o.GetSummary() == nil && o.GetWorker() != "" || d.resumed != nil && d.resumed[i] {
		// The stream was cut, or the task had an attempt under the lost
		// orchestrator whose spend stands: what the task spent is in the
		// ledger, once the worker has settled what it held (briefly; a dead
		// worker's leases are left to the sweeper and counted at the run's
		// end).
		o.TokensSpent = d.settledSpend(ctx, budget.AccountID(req.GetTaskAccountId()))
		startedBefore(o)
	}
	stored := d.finishTask(ctx, o)
	d.reportBudget(ctx, runCtx)
	return stored
}

// settleWait bounds how long a cut-off task's spend is waited for.
const settleWait = 3 * time.Second

// settledSpend reads a task account's spend once nothing is reserved on it,
// waiting up to settleWait for the worker to settle a cut-off call.
func (d *driver) settledSpend(ctx context.Context, id budget.AccountID) int64 {
	ctx, cancel := context.WithTimeout(ctx, settleWait)
	defer cancel()
	var spent int64
	for {
		acct, err := d.e.ledger.Account(ctx, id)
		if err == nil {
			spent = acct.Spent
			if acct.Reserved == 0 {
				return spent
			}
		}
		if !sleep(ctx, 20*time.Millisecond) { // polling the ledger, bounded by settleWait
			return spent
		}
	}
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

// cleanup is a context for the writes that record how a run or task ended:
// detached from the run's cancellation, bounded by cleanupTimeout.
func cleanup(runCtx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(runCtx), cleanupTimeout)
}

// taskProgress records a dispatched task's start (in the store, then as a
// TaskStarted event) and its iterations (TaskIteration events).
type taskProgress struct {
	d      *driver
	index  int
	taskID string
}

func (p taskProgress) started(ctx context.Context, worker string) {
	d := p.d
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	started := &fanoutv1.TaskStarted{TaskId: p.taskID, Worker: worker, ForecastTokens: d.fc.forecastOf(p.index)}
	_, err := d.e.store.StartTask(ctx, d.runID, d.e.cfg.Node, started) // and its TaskStarted
	switch {
	case err == nil:
		d.e.wake(d.runID)
	case errors.Is(err, runs.ErrNotOwner):
		d.lose(ctx, err)
	case errors.Is(err, runs.ErrEnded): // ended by the replica that adopted the run
		d.e.cfg.Logger.InfoContext(ctx, "task ended elsewhere", "run_id", d.runID, "task_id", p.taskID, "err", err)
	default:
		// The task runs on; followers hear of it by its event, at least.
		d.e.cfg.Logger.ErrorContext(ctx, "start task", "run_id", d.runID, "task_id", p.taskID, "err", err)
		d.event(ctx, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskStarted{TaskStarted: started}})
	}
}

func (p taskProgress) iteration(ctx context.Context, it *fanoutv1.SubagentIteration) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if p.d.fc != nil { // first: the task asks for its next grant as soon as it sent this
		if tasks := p.d.fc.progress(p.index, it.GetTokensSpent(), it.GetGrantedTokens()); len(tasks) > 0 {
			p.d.windDown(ctx, tasks)
		}
	}
	p.d.event(ctx, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskIteration{TaskIteration: &fanoutv1.TaskIteration{
		TaskId: p.taskID, Iteration: it.GetIteration(), TokensSpent: it.GetTokensSpent(), ToolCalls: it.GetToolCalls()}}})
}

// approval records that the task's write waits for a person's approval.
func (p taskProgress) approval(ctx context.Context, a *fanoutv1.SubagentApproval) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	p.d.event(ctx, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_ApprovalRequested{ApprovalRequested: &fanoutv1.ApprovalRequested{
		TaskId: p.taskID, CallId: a.GetCallId(), Tool: a.GetTool(), Preview: a.GetPreview(), Deadline: a.GetDeadline()}}})
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
