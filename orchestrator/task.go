package orchestrator

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// A task's life under its run's driver: its dispatch is built (request),
// run on a worker (runTask) while its progress is recorded (taskProgress),
// and its end persisted (finishTask), with what it spent read from the
// ledger when the worker could not report it (settledSpend).

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
		CacheTools:           spec.GetCache().GetTools(),
		FanOut:               d.fanOutAllowance(),
	}
}

// fanOutAllowance is what the run's tasks may ask of fan_out, nil when
// they may not fan out.
func (d *driver) fanOutAllowance() *fanoutv1.FanOutAllowance {
	f := d.p.spec.GetFanOut()
	if f == nil {
		return nil
	}
	return &fanoutv1.FanOutAllowance{MaxChildTasks: uint32(maxChildTasks(f))}
}

// runTask dispatches task i (to first, then others while they refuse it),
// persists its outcome and reports the run's budget.
func (d *driver) runTask(runCtx context.Context, i int, first Worker, req *fanoutv1.Dispatch,
	begun *budget.Attempt) *fanoutv1.TaskOutcome {
	taskCtx, cancel := context.WithTimeoutCause(runCtx, req.GetTask().GetTimeout().AsDuration(), errTaskTimeout)
	defer cancel()

	resumed := d.resumed != nil && d.resumed[i]
	o := d.holdTaskSlot(taskCtx, req.GetTask().GetId(), func(ctx context.Context) *fanoutv1.TaskOutcome {
		c := d.newDispatch(first, req, taskProgress{d: d, index: i, taskID: req.GetTask().GetId()})
		if !d.stopping(runCtx) {
			// Not once the run was told to stop while this task waited (for
			// a tenant slot): its dispatch asks the ledger, which says why.
			c.begun = begun
		}
		return d.runHedged(runCtx, ctx, i, c) // c.run, unless the task is hedged
	})
	o.TaskId, o.DispatchIndex = req.GetTask().GetId(), int32(i)
	o.ForecastTokens = d.fc.forecastOf(i)

	ctx, cancelCleanup := cleanup(runCtx)
	defer cancelCleanup()
	fanned := d.fannedOut(i)
	if fanned && !d.ar.isLost() { // a lost run's task runs on under its adopter, and so do its children
		// A child still running when its task ended (cancelled, timed out,
		// a join policy's cut) is cancelled: nobody will read its answer.
		d.e.cancelChildren(ctx, d.runID, req.GetTask().GetId(), "its parent task ended "+runs.Text(o.GetStatus()))
	}
	if o.GetHedge() == nil && (o.GetSummary() == nil && o.GetWorker() != "" || resumed) {
		// The stream was cut, or the task had an attempt under the lost
		// orchestrator whose spend stands: what the task spent is in the
		// ledger, once the worker has settled what it held (briefly; a dead
		// worker's leases are left to the sweeper and counted at the run's
		// end). A hedged task's attempts were counted by runHedged.
		o.TokensSpent = d.settledSpend(ctx, budget.AccountID(req.GetTaskAccountId()))
		if resumed {
			o.TokensSpent += d.earlierHedgeSpent(ctx, req.GetTask().GetId())
		}
		startedBefore(o)
	} else if fanned {
		// Its children's spend is the task's (their fundings settled on
		// its account before their answers reached it, or, for a child
		// cancelled with it, when that child has closed: waited for as
		// long as a run's end waits for what it holds): the ledger's
		// word, not the worker's count of its own calls.
		o.TokensSpent = d.settledSpendWithin(ctx, budget.AccountID(req.GetTaskAccountId()), d.e.cfg.HeldWait)
	}
	stored := d.finishTask(ctx, o)
	d.hedges.record(stored)
	d.reportBudget(ctx, runCtx)
	return stored
}

// taskProgress records a dispatched task's start (in the store, then as a
// TaskStarted event) and its iterations (TaskIteration events).
type taskProgress struct {
	d      *driver
	index  int
	taskID string
	// attempts, for a hedged task, is what both its attempts spent: its
	// TaskIteration events say that; the forecast and the call statistics
	// see the first attempt's own spend (the hedge's is its own,
	// attemptProgress).
	attempts *attemptSpend
}

func (p taskProgress) started(ctx context.Context, worker string) {
	d := p.d
	d.observeStart(p.index)
	detached := context.WithoutCancel(ctx)
	sctx, cancel := context.WithTimeout(detached, startTimeout)
	defer cancel()
	started := &fanoutv1.TaskStarted{TaskId: p.taskID, Worker: worker, ForecastTokens: d.fc.forecastOf(p.index)}
	_, err := d.e.store.StartTask(sctx, d.runID, d.e.cfg.Node, started) // and its TaskStarted
	switch {
	case err == nil:
		d.e.wake(d.runID)
	case errors.Is(err, runs.ErrNotOwner):
		d.lose(sctx, err)
	case errors.Is(err, runs.ErrEnded): // ended by the replica that adopted the run
		d.e.cfg.Logger.InfoContext(sctx, "task ended elsewhere", "run_id", d.runID, "task_id", p.taskID, "err", err)
	default:
		// The task runs on; followers hear of it by its event, at least:
		// appended on a context of its own, since StartTask may have used
		// all of its own (a slow database), and the event is what tells
		// that the task started.
		d.e.cfg.Logger.ErrorContext(sctx, "start task", "run_id", d.runID, "task_id", p.taskID, "err", err)
		ectx, cancel := context.WithTimeout(detached, cleanupTimeout)
		defer cancel()
		d.event(ectx, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskStarted{TaskStarted: started}})
	}
}

// startTimeout bounds a task's StartTask; a variable for the tests of what
// happens when it runs out.
var startTimeout = cleanupTimeout

func (p taskProgress) iteration(ctx context.Context, it *fanoutv1.SubagentIteration) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	p.d.observeCall(p.index, it.GetTokensSpent(), it.GetWaited().AsDuration())
	if p.d.fc != nil { // first: the task asks for its next grant as soon as it sent this
		if tasks := p.d.fc.progress(p.index, it.GetTokensSpent(), it.GetGrantedTokens(), it.GetLast()); len(tasks) > 0 {
			p.d.windDown(ctx, tasks)
		}
	}
	spent := it.GetTokensSpent()
	if p.attempts != nil {
		spent = p.attempts.total()
	}
	p.d.event(ctx, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskIteration{TaskIteration: &fanoutv1.TaskIteration{
		TaskId: p.taskID, Iteration: it.GetIteration(), TokensSpent: spent, ToolCalls: it.GetToolCalls(),
		CachedToolCalls: it.GetCachedToolCalls()}}})
}

// approval records that the task's write waits for a person's approval.
func (p taskProgress) approval(ctx context.Context, a *fanoutv1.SubagentApproval) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	p.d.event(ctx, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_ApprovalRequested{ApprovalRequested: &fanoutv1.ApprovalRequested{
		TaskId: p.taskID, CallId: a.GetCallId(), Tool: a.GetTool(), Preview: a.GetPreview(), Deadline: a.GetDeadline()}}})
}

// fanOut opens the child run the task's fan_out call asks for.
func (p taskProgress) fanOut(ctx context.Context, attempt int32, f *fanoutv1.SubagentFanOut) {
	p.d.fanOut(ctx, p.index, attempt, f)
}

// settleWait bounds how long a cut-off task's spend is waited for.
const settleWait = 3 * time.Second

// settledSpend reads a task account's spend once nothing is reserved on it,
// waiting up to settleWait for the worker to settle a cut-off call.
func (d *driver) settledSpend(ctx context.Context, id budget.AccountID) int64 {
	return d.settledSpendWithin(ctx, id, settleWait)
}

// settledSpendWithin is settledSpend waiting up to wait.
func (d *driver) settledSpendWithin(ctx context.Context, id budget.AccountID, wait time.Duration) int64 {
	ctx, cancel := context.WithTimeout(ctx, wait)
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

// endUndispatched records task i, which ends as o says without being
// dispatched (it never ran: at most a NOT_STARTED summary says why).
func (d *driver) endUndispatched(runCtx context.Context, i int, o *fanoutv1.TaskOutcome) {
	ctx, cancel := cleanup(runCtx)
	defer cancel()
	o.TaskId, o.DispatchIndex = d.p.spec.GetTasks()[i].GetId(), int32(i)
	if d.resumed != nil && d.resumed[i] { // the lost orchestrator's attempt may have spent
		o.TokensSpent = d.settledSpend(ctx, d.accounts.Tasks[o.GetTaskId()]) + d.earlierHedgeSpent(ctx, o.GetTaskId())
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
