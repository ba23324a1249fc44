package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// Runs are leased: the engine driving a run refreshes run.owner_heartbeat
// every Config.HeartbeatInterval, and a run whose heartbeat is older than
// Config.OrphanAfter (database time) is adopted by whichever live replica
// takes it first. Adopting a run ends it honestly instead of driving it
// on: the ledger run is cancelled (every worker's watcher stops the run's
// subagents), unfinished tasks fail with "orchestrator lost", what exists is
// joined and the run ends FAILED. Re-driving an adopted run (re-planning its
// unfinished tasks on the adopter) is future work: it needs the plan and the
// task accounts rebuilt from the stored spec, and workers that accept a
// second attempt of a task whose first attempt's spend stands.
//
// A replica whose heartbeat lapsed (a long pause, a partition) but that
// still runs is fenced by the store: a terminal task outcome is final, only
// the owner can end a run, and a run that ended takes no more events.

// maxAdopting bounds the orphaned runs one engine ends at once; the others
// stay orphaned until a later tick here or on another replica.
const maxAdopting = 16

// errRunLost is the cause of a run this engine drove that another replica
// adopted while this engine's heartbeat lapsed.
var errRunLost = errors.New("another orchestrator adopted the run while this one's heartbeat lapsed")

// lostTaskReason is the error of a task that had not ended when the run's
// orchestrator was lost.
const lostTaskReason = "orchestrator lost"

// heartbeat refreshes the leases of this engine's runs and adopts orphaned
// runs, every HeartbeatInterval, until ctx ends. Shutdown stops it.
func (e *Engine) heartbeat(ctx context.Context) {
	defer close(e.beatDone)
	tick := time.NewTicker(e.cfg.HeartbeatInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		e.beat(ctx)
	}
}

// beat is one heartbeat: one statement refreshes every lease this engine
// holds, then orphaned runs are adopted one at a time.
func (e *Engine) beat(ctx context.Context) {
	// A late heartbeat still counts until OrphanAfter, so it may take longer
	// than one interval (ticks missed meanwhile are dropped).
	ctx, cancel := context.WithTimeout(ctx, e.cfg.OrphanAfter/2)
	defer cancel()
	e.mu.Lock()
	ids := slices.Sorted(maps.Keys(e.active))
	e.mu.Unlock()
	lost, err := e.store.Heartbeat(ctx, e.cfg.Node, ids)
	if err != nil {
		// Adopting needs the same database; try both again next tick.
		e.cfg.Logger.WarnContext(ctx, "heartbeat", "runs", len(ids), "err", err)
		return
	}
	for _, id := range lost {
		e.cfg.Logger.ErrorContext(ctx, "another orchestrator adopted a run this one drives", "run_id", id)
		e.mu.Lock()
		if ar := e.active[id]; ar != nil {
			ar.cancel(errRunLost)
		}
		e.mu.Unlock()
	}
	e.adoptOrphans(ctx)
}

// adoptOrphans takes ownership of orphaned runs, one conditional UPDATE
// each, and ends each in the background.
func (e *Engine) adoptOrphans(ctx context.Context) {
	release := func() {
		e.mu.Lock()
		e.adopting--
		e.mu.Unlock()
		e.wg.Done()
	}
	for {
		// Take the slot (and the WaitGroup count Shutdown waits on) before
		// the UPDATE, so that no run is adopted and then left behind.
		e.mu.Lock()
		if e.closing || e.adopting >= maxAdopting {
			e.mu.Unlock()
			return
		}
		e.adopting++
		e.wg.Add(1)
		e.mu.Unlock()

		runID, prev, err := e.store.AdoptOrphan(ctx, e.cfg.Node, e.cfg.OrphanAfter)
		if err != nil || runID == "" {
			release()
			if err != nil && ctx.Err() == nil {
				e.cfg.Logger.WarnContext(ctx, "adopt orphaned runs", "err", err)
			}
			return
		}
		e.mu.Lock()
		if e.active[runID] != nil {
			// This engine drives it (its own lease lapsed, e.g. the database
			// was unreachable): the UPDATE renewed the lease; drive on.
			e.mu.Unlock()
			release()
			continue
		}
		// Registered as active: heartbeats keep the lease while it ends, and
		// local watchers wake on its events.
		e.active[runID] = &activeRun{cancel: func(error) {}, changed: make(chan struct{})}
		e.mu.Unlock()
		go func() {
			defer release()
			defer func() {
				e.mu.Lock()
				delete(e.active, runID)
				e.mu.Unlock()
			}()
			e.endOrphan(runID, prev)
		}()
	}
}

// endOrphan ends a run adopted from prevOwner: it cancels the ledger run
// (every worker stops the run's subagents), waits (up to HeldWait) for
// reservations still held to be settled or to expire, fails the tasks that
// had not ended, closes the ledger run, joins what exists, and records the
// end (TaskFinished for each failed task, then RunFinished) so that
// watchers on every replica see it.
func (e *Engine) endOrphan(runID, prevOwner string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(e.base), cleanupTimeout)
	defer cancel()
	log := e.cfg.Logger.With("run_id", runID, "prev_owner", prevOwner)
	log.WarnContext(ctx, "adopting the run of a lost orchestrator: ending it")
	if _, err := e.ledger.CancelRun(ctx, runID, fmt.Sprintf("orchestrator %s lost", prevOwner)); err != nil &&
		!errors.Is(err, budget.ErrNotFound) { // it died before opening the accounts
		log.ErrorContext(ctx, "cancel ledger run", "err", err)
	}
	e.awaitHeld(e.base, runID)

	ctx, cancel = context.WithTimeout(context.WithoutCancel(e.base), cleanupTimeout)
	defer cancel()
	// Failed after the wait, so that their tokens are what they settled.
	failed, err := e.store.FailTasks(ctx, runID, lostTaskReason)
	if err != nil {
		// The run stays RUNNING under this node; once it leaves e.active its
		// lease lapses and it is adopted again.
		log.ErrorContext(ctx, "fail unfinished tasks", "err", err)
		return
	}
	closed, err := e.ledger.CloseRun(ctx, runID)
	if err != nil && !errors.Is(err, budget.ErrNotFound) {
		log.ErrorContext(ctx, "close ledger run", "err", err)
	}
	run, err := e.store.GetRun(ctx, "", runID)
	if err != nil {
		log.ErrorContext(ctx, "read adopted run", "err", err)
		return
	}
	result := join(run.GetTasks())
	if run.GetSpec().GetSynthesize() {
		result.SynthesisSkippedReason = "the run's orchestrator was lost before the run ended"
	}
	for _, o := range failed {
		countTask(ctx, o.GetStatus())
		if _, err := e.appendEvent(ctx, runID, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskFinished{
			TaskFinished: &fanoutv1.TaskFinished{Outcome: o}}}); err != nil {
			log.ErrorContext(ctx, "append TaskFinished", "task_id", o.GetTaskId(), "err", err)
		}
	}
	if closed.ID != 0 {
		// The ledger is the truth, and followers' budget views end with it.
		result.TotalTokens = closed.Spent
		if _, err := e.appendEvent(ctx, runID, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_BudgetUpdate{
			BudgetUpdate: &fanoutv1.BudgetUpdate{Budget: snapshot(closed)}}}); err != nil {
			log.ErrorContext(ctx, "append BudgetUpdate", "err", err)
		}
	}
	cause := fmt.Sprintf("orchestrator %s lost before the run ended", prevOwner)
	if e.finishRun(ctx, runID, fanoutv1.RunState_RUN_STATE_FAILED, cause, result) {
		log.WarnContext(ctx, "adopted run ended", "state", "FAILED", "cause", cause,
			"tasks_failed", len(failed), "tokens", result.GetTotalTokens())
	}
}

// stopHeartbeat stops the heartbeat loop and waits for it. Idempotent.
func (e *Engine) stopHeartbeat() {
	e.stopBeat()
	<-e.beatDone
}
