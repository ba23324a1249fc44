package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// A run is continued with more budget (docs/budget.md#continue): the
// ledger raises its limit, once per idempotency key, and a run that ended
// BUDGET_EXHAUSTED reopens. Its NOT_STARTED tasks, and the tasks SKIPPED
// for them, are admitted again by forecast; the tasks that ended keep
// their outcomes and are never run again; the synthesis is made again
// over every task's facts. The engine that continues a reopened run
// drives it, as an adopter drives a resumed one (resume.go): the same
// plan, the ended tasks replayed through the scheduler, the others
// dispatched as new attempts. A run still running is topped up: its owner
// reads the larger limit when its forecast would otherwise leave a task
// NOT_STARTED (driver.ledgerLimit).

// maxContinueWait bounds how long a ContinueRun of a run that is ending
// (its budget exhausted, its tasks draining) waits for its end before it
// reopens it.
const maxContinueWait = 30 * time.Second

// ContinueParams is a ContinueRun: Add tokens for run RunID of TenantID,
// once per Key, by Actor for Reason.
type ContinueParams struct {
	TenantID, RunID, Key, Actor, Reason string
	Add                                 int64
	DryRun                              bool
}

// Continue continues a run (ContinueRun). With DryRun it writes nothing
// and returns the run as it is with the continuation's quote. Errors:
// runs.ErrNotFound, a budget.ValidationErrors, a *runs.ContinueError for a
// continuation the ledger refused (nothing was written).
func (e *Engine) Continue(ctx context.Context, c ContinueParams) (*fanoutv1.Run, *fanoutv1.RunContinued, *fanoutv1.Quote, error) {
	run, err := e.store.GetRun(ctx, c.TenantID, c.RunID)
	if err != nil {
		return nil, nil, nil, err
	}
	if !c.DryRun {
		// A retry is answered first, whatever the checks below would say
		// of a new continuation now (the run has the retried one's tokens).
		if done, err := e.store.Continuation(ctx, c.RunID, c.Key); err == nil {
			if done.GetAddedTokens() != c.Add {
				return nil, nil, nil, &runs.ContinueError{Outcome: "conflict", Added: done.GetAddedTokens()}
			}
			return run, done, nil, nil
		} else if !errors.Is(err, runs.ErrNotFound) {
			return nil, nil, nil, err
		}
	}
	p, err := e.cfg.plan(run.GetSpec())
	if err != nil {
		return nil, nil, nil, &runs.ContinueError{Outcome: "ended",
			State: fmt.Sprintf("%s, and its spec no longer plans on this server (%v)", runs.Text(run.GetState()), err)}
	}
	limit := p.spec.GetBudget().GetLimitTokens() + run.GetAddedTokens()
	maxLimit, err := e.maxLimit(ctx, p, limit, c.Add)
	if err != nil {
		return nil, nil, nil, err
	}
	readmit := readmitted(p, run.GetTasks())
	if err := joinAllows(p, run.GetTasks(), readmit); err != nil {
		return nil, nil, nil, err
	}
	if c.DryRun {
		// The prior and the tenant's budget, as quoteRun reads them (a
		// spent tenant budget is what the quote says, not an error).
		if err := e.checkTenant(ctx, p, true); err != nil && !errors.Is(err, ErrTenantExhausted) {
			return nil, nil, nil, err
		}
		e.sizeFirst(ctx, p)
		q, err := e.quoteContinuation(ctx, p, c.RunID, limit+c.Add, run.GetTasks(), readmit)
		return run, nil, q, err
	}
	if e.isClosing() {
		return nil, nil, nil, ErrShuttingDown
	}
	req := runs.Continue{RunID: c.RunID, TenantID: c.TenantID, Key: c.Key, Owner: e.cfg.Node, Actor: c.Actor,
		Reason: c.Reason, Add: c.Add, Held: p.synthesisHeld, MaxLimit: maxLimit, Tasks: taskIDs(p, readmit)}
	// Once the continuation is written, drive it even if the caller leaves.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout+maxContinueWait)
	defer cancel()
	// Registered before the ledger may reopen an ended run under this
	// node: heartbeats keep its lease until driveContinued drives it. (A
	// run still running is its owner's: a placeholder here would be told
	// by the heartbeat that another node drives it.)
	placeholder := newActiveRun(func(error) {})
	e.mu.Lock()
	if e.active[c.RunID] == nil && run.GetState() != fanoutv1.RunState_RUN_STATE_RUNNING {
		e.active[c.RunID] = placeholder
	}
	e.mu.Unlock()
	defer e.forgetOwn(c.RunID, placeholder) // a top-up, a replay, a refusal, or a drive that failed
	done, err := e.continueWhenEnded(wctx, ctx, req, p, run)
	if err != nil {
		return nil, nil, nil, err
	}
	if !done.Replay && done.Continuation.GetReopened() {
		e.wake(c.RunID)
		// What this node's watcher heard of the run's end is of that end
		// (the ledger's reopen notice tells the other nodes).
		e.watcher.Reopened(c.RunID)
		if err := e.driveContinued(wctx, c.RunID, p, done); err != nil {
			// The run is RUNNING and owned here; undriven, its lease lapses
			// and a replica adopts it (resume.go).
			e.cfg.Logger.ErrorContext(wctx, "drive the continued run; it will be adopted", "run_id", c.RunID, "err", err)
		}
	} else if !done.Replay {
		e.wake(c.RunID)
	}
	out, err := e.Get(wctx, c.TenantID, c.RunID)
	return out, done.Continuation, nil, err
}

// continueWhenEnded records the continuation, waiting (up to
// maxContinueWait, or the caller's deadline) while the run is ending: a
// run whose budget ran out drains and closes before it reopens.
func (e *Engine) continueWhenEnded(ctx, caller context.Context, req runs.Continue, p *plan,
	run *fanoutv1.Run) (runs.Continued, error) {
	deadline := time.Now().Add(maxContinueWait)
	tick := time.NewTicker(e.cfg.WatchPollInterval)
	defer tick.Stop()
	for {
		if run.GetState() == fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED && len(req.Tasks) == 0 {
			return runs.Continued{}, &runs.ContinueError{Outcome: "nothing"}
		}
		done, err := e.store.ContinueRun(ctx, req)
		var refused *runs.ContinueError
		if !errors.As(err, &refused) || refused.Outcome != "busy" || time.Now().After(deadline) {
			return done, err
		}
		select {
		case <-caller.Done():
			return runs.Continued{}, refused
		case <-tick.C:
		}
		// The run's tasks may have ended differently by its end: what is
		// admitted again is read again.
		if run, err = e.store.GetRun(ctx, req.TenantID, req.RunID); err != nil {
			return runs.Continued{}, err
		}
		req.Tasks = taskIDs(p, readmitted(p, run.GetTasks()))
	}
}

// maxLimit is the most a run of plan p may have as its budget: the
// server's cap on a run's budget, and its tenant's max_run_tokens. It
// refuses an addition that passes it (or that overflows), naming the
// field.
func (e *Engine) maxLimit(ctx context.Context, p *plan, limit, add int64) (int64, error) {
	most := int64(math.MaxInt64) // no cap: only overflow
	if e.cfg.MaxRunTokens > 0 {
		most = e.cfg.MaxRunTokens
	}
	if e.tenants != nil {
		q, err := e.tenants.TenantQuotas(ctx, p.tenantID)
		if err != nil {
			return 0, fmt.Errorf("read the quotas of tenant %s: %w", p.tenantID, err)
		}
		if q.MaxRunTokens != nil {
			most = min(most, *q.MaxRunTokens)
		}
	}
	if add > most-limit {
		var v validator
		v.overCap("add_tokens", "must be at most %d (the run's budget is %d, and a run's budget at most %d), got %d",
			max(most-limit, 0), limit, most, add)
		return 0, v.err()
	}
	return most, nil
}

// readmitted are the tasks a continuation admits again, by dispatch
// index: those NOT_STARTED, and those SKIPPED whose dependencies all
// SUCCEEDED or are admitted again (at least one is). The others ended for
// good: they keep their outcomes.
func readmitted(p *plan, tasks []*fanoutv1.TaskOutcome) []int {
	in := make([]bool, len(tasks))
	status := func(i int) fanoutv1.TaskStatus { return tasks[i].GetStatus() }
	for i := range tasks {
		in[i] = status(i) == fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED
	}
	for grew := true; grew; {
		grew = false
		for i := range tasks {
			if in[i] || status(i) != fanoutv1.TaskStatus_TASK_STATUS_SKIPPED || i >= len(p.deps) {
				continue
			}
			ok, waits := true, false
			for _, j := range p.deps[i] {
				waits = waits || in[j]
				ok = ok && (in[j] || status(j) == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED)
			}
			if ok && waits {
				in[i], grew = true, true
			}
		}
	}
	var out []int
	for i, ok := range in {
		if ok {
			out = append(out, i)
		}
	}
	return out
}

// taskIDs are the ids of plan p's tasks at indexes.
func taskIDs(p *plan, indexes []int) []string {
	ids := make([]string, len(indexes))
	for k, i := range indexes {
		ids[k] = p.spec.GetTasks()[i].GetId()
	}
	return ids
}

// quoteContinuation quotes a continuation of a run whose tasks are as
// stored: the tasks admitted again run; the others do not (those that
// ended keep their outcomes, those still running are the run's already).
func (e *Engine) quoteContinuation(ctx context.Context, p *plan, runID string, limit int64, stored []*fanoutv1.TaskOutcome,
	readmit []int) (*fanoutv1.Quote, error) {
	acct, err := e.ledger.RunAccount(ctx, runID)
	if err != nil {
		return nil, fmt.Errorf("read the run's ledger account: %w", err)
	}
	p.spentBeside = acct.Spent - tasksSpent(stored) // its earlier syntheses
	again := map[int]bool{}
	for _, i := range readmit {
		again[i] = true
	}
	ended := make([]*fanoutv1.TaskOutcome, len(stored))
	notRun := map[int]*fanoutv1.TaskQuote{}
	for i, o := range stored {
		if again[i] {
			continue
		}
		if hasEnded(o.GetStatus()) {
			ended[i] = o
		}
		notRun[i] = &fanoutv1.TaskQuote{Reason: runs.Text(o.GetStatus())}
	}
	return e.quoteRun(ctx, p, limit, ended, notRun)
}

// driveContinued drives a run this engine just reopened: its accounts
// (with the larger limit and the synthesis allowance held again), the
// tasks that ended replayed, the others dispatched.
func (e *Engine) driveContinued(ctx context.Context, runID string, p *plan, done runs.Continued) error {
	if err := e.checkTenant(ctx, p, true); err != nil {
		return err
	}
	run, err := e.store.ReadRun(ctx, runID)
	if err != nil {
		return fmt.Errorf("read the run: %w", err)
	}
	accounts, err := e.ledger.OpenRun(ctx, openRunParams(runID, p)) // the accounts it has
	if err != nil {
		return fmt.Errorf("read the run's ledger accounts: %w", err)
	}
	// What the run spent beside its tasks (its earlier syntheses) is spent
	// too: the forecast admits against what is left of it.
	p.spentBeside = accounts.Run.Spent - tasksSpent(run.GetTasks())
	var unfinished []int
	for i, o := range run.GetTasks() {
		if !hasEnded(o.GetStatus()) {
			unfinished = append(unfinished, i)
		}
	}
	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		return ErrShuttingDown
	}
	span := e.startRunSpan(ctx, time.Now(), runID, p)
	span.AddEvent("continued", trace.WithAttributes(attrNode.String(e.cfg.Node)))
	runCtx, cancelRun := context.WithCancelCause(trace.ContextWithSpan(e.base, span))
	ar := newActiveRun(cancelRun)
	e.active[runID] = ar // replaces the placeholder, or an ending driver's entry (it forgets only its own)
	e.wg.Add(1)
	e.mu.Unlock()

	e.cfg.Logger.InfoContext(ctx, "continued run reopened", "run_id", runID, "limit_tokens", accounts.Run.Limit,
		"tasks", len(p.spec.GetTasks()), "admitted_again", len(unfinished))
	d := newDriver(e, p, runID, accounts, ar, span)
	d.epoch = done.Epoch
	d.restore(run.GetTasks(), unfinished)
	d.resumed = nil // its ended tasks are its own: this is no adoption

	go func() {
		defer e.wg.Done()
		d.drive(runCtx, cancelRun)
	}()
	return nil
}

// ledgerLimit is the run's limit as the ledger has it, 0 when it cannot be
// read or the run's account is not open (a continuation that raised it
// also reopened it). Read before a task is left NOT_STARTED: a
// continuation written on any node raises it.
func (d *driver) ledgerLimit() int64 {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	acct, err := d.e.ledger.RunAccount(ctx, d.runID)
	if err != nil || acct.State != budget.StateOpen {
		return 0
	}
	return acct.Limit
}

// tasksSpent is what a run's tasks spent, as their outcomes say.
func tasksSpent(tasks []*fanoutv1.TaskOutcome) int64 {
	var n int64
	for _, o := range tasks {
		n += o.GetTokensSpent()
	}
	return n
}

// joinAllows refuses a continuation its run's join policy would stop at
// once: a FAIL_FAST run one of whose kept tasks did not succeed, or a
// FIRST_SUCCESS run one of whose did (the tasks admitted again do not
// count: they run again). The added tokens and the synthesis held again
// would pay for nothing but an end; a fork runs the tasks again.
func joinAllows(p *plan, tasks []*fanoutv1.TaskOutcome, readmit []int) error {
	again := map[int]bool{}
	for _, i := range readmit {
		again[i] = true
	}
	policy := p.spec.GetJoinPolicy()
	for i, o := range tasks {
		if again[i] || !hasEnded(o.GetStatus()) || o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SKIPPED {
			continue
		}
		ok := o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED
		if policy == fanoutv1.JoinPolicy_JOIN_POLICY_FAIL_FAST && !ok ||
			policy == fanoutv1.JoinPolicy_JOIN_POLICY_FIRST_SUCCESS && ok {
			return &runs.ContinueError{Outcome: "join", State: fmt.Sprintf("%s: task %s ended %s",
				runs.Text(policy), o.GetTaskId(), runs.Text(o.GetStatus()))}
		}
	}
	return nil
}
