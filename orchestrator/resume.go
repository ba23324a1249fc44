package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// A run whose orchestrator was lost is resumed by the replica that adopts
// it, from what the database holds: the spec is planned again, finished
// tasks keep their outcomes and spend, and the others are dispatched again
// as new attempts. Two attempts of one task never hold grants at once:
// before anything is dispatched, every unfinished task's account begins a
// new attempt, which fences the old one's reserves in the ledger, and the
// run waits until the old attempts' reservations are settled (a worker
// whose stream to the lost orchestrator broke stops and settles at once)
// or posted by the sweeper when their leases end. Deadlines count from the
// run's and each task's first start, in database time. Join and synthesis
// happen as for any run.

// maxAdoptions is how many times a run may change hands. A run whose
// orchestrators keep being lost (a poison run that crashes them, a crash
// loop) is ended FAILED on its next adoption instead of resumed again.
const maxAdoptions = 3

// takeOver drives an adopted run on, or ends it if it was adopted too many
// times or cannot be resumed. It returns once the run is driven again (its
// driver counts in e.wg) or has ended.
func (e *Engine) takeOver(a runs.Adoption) {
	log := e.cfg.Logger.With("run_id", a.RunID, "prev_owner", a.PrevOwner, "adoptions", a.Adoptions)
	if a.Adoptions > maxAdoptions {
		log.Error("run adopted too many times: ending it")
		e.endOrphan(a, fmt.Sprintf(
			"run adopted %d times (its orchestrators kept being lost, the last was %s); the limit is %d",
			a.Adoptions, a.PrevOwner, maxAdoptions))
		return
	}
	log.Warn("adopting the run of a lost orchestrator: resuming it")
	err := e.resume(a)
	if err == nil {
		return
	}
	var unresumable *resumeError
	if !errors.As(err, &unresumable) {
		// The database could not be read or written, or this engine is
		// shutting down: leave the run as it is and forget it, so that its
		// lease lapses and a replica adopts it again (counted).
		log.Error("resume adopted run; leaving it to be adopted again", "err", err)
		e.forget(a.RunID)
		return
	}
	log.Error("adopted run cannot be resumed: ending it", "err", err)
	e.endOrphan(a, fmt.Sprintf("orchestrator %s lost before the run ended, and the run cannot be resumed: %v",
		a.PrevOwner, err))
}

// resumeError says why an adopted run cannot be driven on here (its spec
// does not plan under this replica's configuration).
type resumeError struct{ err error }

func (e *resumeError) Error() string { return e.err.Error() }
func (e *resumeError) Unwrap() error { return e.err }

// resume re-plans the adopted run, fences and waits out its unfinished
// tasks' earlier attempts, records the change of hands, and starts driving
// it here.
func (e *Engine) resume(a runs.Adoption) error {
	adopted := time.Now() // a.At on this node's clock
	ctx, cancel := cleanup(e.base)
	defer cancel()
	run, err := e.store.ReadRun(ctx, a.RunID)
	if err != nil {
		return fmt.Errorf("read the run: %w", err)
	}
	p, err := e.cfg.plan(run.GetSpec())
	if err != nil {
		return &resumeError{fmt.Errorf("its spec does not plan here: %w", err)}
	}
	if err := e.checkTenant(ctx, p, true); err != nil {
		return err
	}
	if p.tree = treeOf(run); p.tree.parentRunID != "" {
		p.tenantAccount = 0 // a child's funding is held above it
	}
	accounts, err := e.ledger.OpenRun(ctx, openRunParams(a.RunID, p)) // the accounts it has
	if err != nil {
		return fmt.Errorf("read the run's ledger accounts: %w", err)
	}
	// A reopened run's earlier syntheses spent of its limit too
	// (docs/budget.md#continue); 0 for a run never continued.
	p.spentBeside = accounts.Run.Spent - tasksSpent(run.GetTasks())
	unfinished := e.fence(ctx, a.RunID, p, accounts, run.GetTasks())
	e.awaitHeld(e.base, a.RunID) // the fenced attempts' reservations end

	left := deadlinesLeft(p, run, a.At.Add(time.Since(adopted)))
	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		return errors.New("this orchestrator is shutting down")
	}
	span := e.startRunSpan(ctx, time.Now(), a.RunID, p)
	span.AddEvent("adopted", trace.WithAttributes(attrNode.String(e.cfg.Node)))
	runCtx, cancelRun := context.WithCancelCause(trace.ContextWithSpan(e.base, span))
	ar := newActiveRun(cancelRun)
	e.active[a.RunID] = ar // replaces the adoption's placeholder
	e.wg.Add(1)
	e.mu.Unlock()

	ids := make([]string, len(unfinished))
	for k, i := range unfinished {
		ids[k] = p.spec.GetTasks()[i].GetId()
	}
	if _, err := e.appendEvent(ctx, a.RunID, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_RunAdopted{
		RunAdopted: &fanoutv1.RunAdopted{PreviousOwner: a.PrevOwner, Owner: e.cfg.Node,
			Adoptions: int32(min(a.Adoptions, maxAdoptions+1)), ResumedTaskIds: ids}}}); err != nil {
		e.cfg.Logger.ErrorContext(ctx, "append RunAdopted", "run_id", a.RunID, "err", err)
	}
	e.cfg.Logger.InfoContext(ctx, "adopted run resumed", "run_id", a.RunID, "prev_owner", a.PrevOwner,
		"tasks", len(p.spec.GetTasks()), "resumed_tasks", len(ids), "run_time_left", left)
	d := newDriver(e, p, a.RunID, accounts, ar, span)
	d.timeLeft, d.epoch = left, int64(a.Adoptions)
	d.restore(run.GetTasks(), unfinished)
	go func() {
		defer e.wg.Done()
		d.drive(runCtx, cancelRun)
	}()
	return nil
}

// fence begins a new attempt on the ledger account of every task of the
// run that had not ended, and on the run account (its synthesis), so that
// the lost orchestrator's dispatches can reserve no more; it returns the
// unfinished tasks' dispatch indexes. A task's hedge's account, if it
// had one, is fenced with it (docs/budget.md#hedged-tasks). An account the ledger no longer
// opens (the run was exhausted or cancelled) needs no fence: it grants
// nothing to anyone, and the driver hears why.
func (e *Engine) fence(ctx context.Context, runID string, p *plan, accounts budget.RunAccounts,
	tasks []*fanoutv1.TaskOutcome) (unfinished []int) {
	ids := []budget.AccountID{accounts.Run.ID}
	for i, o := range tasks {
		if !hasEnded(o.GetStatus()) {
			unfinished = append(unfinished, i)
			ids = append(ids, accounts.Tasks[o.GetTaskId()])
			if h, ok := accounts.Tasks[hedgeAccountPrefix+o.GetTaskId()]; ok {
				ids = append(ids, h) // its hedge's too (hedge.go)
			}
		}
	}
	for _, id := range ids {
		_, err := e.ledger.BeginAttempt(ctx, id, runID, p.tenantID)
		var ex *budget.ExhaustedError
		if err != nil && !errors.As(err, &ex) {
			e.cfg.Logger.WarnContext(ctx, "fence an attempt of the lost orchestrator", "run_id", runID,
				"account", id, "err", err)
		}
	}
	return unfinished
}

// deadlinesLeft shortens p's task timeouts by the time already spent,
// counted in database time from each started task's first start to now,
// and returns the run's time left, counted from its creation, or from its
// last reopening when a continuation reopened it (docs/budget.md#continue:
// each end has the run's timeout). (The run's timeout itself stays as
// planned: it is what a timed-out run's cause names.)
func deadlinesLeft(p *plan, run *fanoutv1.Run, now time.Time) time.Duration {
	left := p.runTimeout
	c := run.GetCreatedAt()
	if run.GetContinuedAt() != nil {
		c = run.GetContinuedAt()
	}
	if c != nil {
		left = max(time.Nanosecond, left-now.Sub(c.AsTime()))
	}
	for i, o := range run.GetTasks() {
		if s := o.GetStartedAt(); s != nil && !hasEnded(o.GetStatus()) {
			p.taskTimeouts[i] = max(time.Millisecond, p.taskTimeouts[i]-now.Sub(s.AsTime()))
		}
	}
	return left
}

// restore gives a resumed run's driver what the lost orchestrator left:
// the outcomes of the tasks that ended, replayed through the scheduler in
// an order it accepts (each once it is ready), so that what is ready, what
// is skipped and what waits are as if this driver had seen them end. Tasks
// the replay skips that the store had not ended yet are ended SKIPPED when
// the drive starts (endUndispatched).
func (d *driver) restore(stored []*fanoutv1.TaskOutcome, unfinished []int) {
	d.resumed = make([]bool, len(d.outcomes))
	for _, i := range unfinished {
		d.resumed[i] = true
	}
	for replayed := true; replayed; {
		replayed = false
		for _, i := range slices.Clone(d.sched.Ready()) {
			o := stored[i]
			if !hasEnded(o.GetStatus()) {
				continue
			}
			d.sched.take(i)
			d.outcomes[i] = o
			if o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
				d.sched.Succeeded(i)
			} else {
				d.pendingSkips = append(d.pendingSkips, d.sched.Failed(i)...)
			}
			replayed = true
		}
	}
	// A skipped task is terminal in the store already unless the lost
	// orchestrator died between a failure and its skips.
	d.pendingSkips = slices.DeleteFunc(d.pendingSkips, func(j int) bool {
		if hasEnded(stored[j].GetStatus()) {
			d.outcomes[j] = stored[j]
			return true
		}
		return false
	})
}

// replayPolicy applies the run's join policy to the outcomes a resumed run
// kept, in the order they ended, as the lost driver did (or would have):
// a FAIL_FAST run with a task that did not succeed, or a FIRST_SUCCESS run
// with one that did, stops before anything is dispatched again, naming the
// first task that stopped it.
func (d *driver) replayPolicy(cancelRun context.CancelCauseFunc) {
	kept := slices.DeleteFunc(slices.Clone(d.outcomes), func(o *fanoutv1.TaskOutcome) bool {
		return o == nil || o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SKIPPED
	})
	slices.SortStableFunc(kept, func(a, b *fanoutv1.TaskOutcome) int {
		return a.GetFinishedAt().AsTime().Compare(b.GetFinishedAt().AsTime())
	})
	for _, o := range kept {
		d.joinPolicy(o, cancelRun)
	}
}

// hasEnded reports whether a task status is final (SKIPPED too).
func hasEnded(s fanoutv1.TaskStatus) bool {
	return s != fanoutv1.TaskStatus_TASK_STATUS_PENDING && s != fanoutv1.TaskStatus_TASK_STATUS_RUNNING &&
		s != fanoutv1.TaskStatus_TASK_STATUS_UNSPECIFIED
}
