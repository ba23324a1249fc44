package orchestrator

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// Runs are leased: the engine driving a run refreshes run.owner_heartbeat
// every Config.HeartbeatInterval, and a run whose heartbeat is older than
// Config.OrphanAfter (database time) is adopted by whichever live replica
// takes it first, which resumes it (resume.go): the run changes hands and
// goes on. A run adopted more than maxAdoptions times, or whose spec does
// not plan on the adopter, is ended instead (endOrphan): the ledger run is
// cancelled (every worker's watcher stops the run's subagents), unfinished
// tasks fail with "orchestrator lost", what exists is joined and the run
// ends FAILED.
//
// A replica whose heartbeat lapsed (a long pause, a partition) but that
// still runs is fenced by the store and the ledger: only the run's owner
// starts and ends its tasks and ends the run, a run that ended takes no
// more events, and the adopter's new attempts fence the old owner's
// reserves. When its heartbeat finds the run taken, or a task write is
// refused as not the owner's, the old driver abandons the run: it stops
// its calls and writes nothing more.

// maxAdopting bounds the orphaned runs one engine takes over at once (until
// each is driven again or ended); the others stay orphaned until a later
// tick here or on another replica.
const maxAdopting = 16

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
	sent := time.Since(e.born)
	lost, err := e.store.Heartbeat(ctx, e.cfg.Node, ids)
	if err == nil {
		e.leaseFrom.Store(int64(sent))
	}
	if err != nil {
		// Adopting needs the same database; try both again next tick.
		e.cfg.Logger.WarnContext(ctx, "heartbeat", "runs", len(ids), "err", err)
		return
	}
	for _, id := range lost {
		e.cfg.Logger.ErrorContext(ctx, "another orchestrator adopted a run this one drives", "run_id", id)
		e.mu.Lock()
		if ar := e.active[id]; ar != nil {
			ar.lose()
		}
		e.mu.Unlock()
	}
	e.adoptOrphans(ctx)
}

// leaseHeld reports whether this engine's leases surely still hold by its
// own clock: its last heartbeat that succeeded was sent less than half of
// OrphanAfter ago. A replica adopts a run only once its heartbeat is older
// than OrphanAfter in database time, so the other half is the margin for
// the database's clock, the network and the heartbeat's own commit. An
// engine whose heartbeats fail (the database is away, the process was
// paused) dispatches nothing until one succeeds again, and so never
// begins an attempt after another replica may have adopted the run: the
// adopter's attempts are never fenced by the lost owner's.
func (e *Engine) leaseHeld() bool {
	return time.Since(e.born)-time.Duration(e.leaseFrom.Load()) < e.cfg.OrphanAfter/2
}

// adoptOrphans takes ownership of orphaned runs, one conditional UPDATE
// each, and takes each over in the background.
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

		a, err := e.store.AdoptOrphan(ctx, e.cfg.Node, e.cfg.OrphanAfter)
		if err != nil || a.RunID == "" {
			release()
			if err != nil && ctx.Err() == nil {
				e.cfg.Logger.WarnContext(ctx, "adopt orphaned runs", "err", err)
			}
			return
		}
		e.mu.Lock()
		if e.active[a.RunID] != nil {
			// This engine drives it (its own lease lapsed, e.g. the database
			// was unreachable): the UPDATE renewed the lease; drive on.
			e.mu.Unlock()
			release()
			continue
		}
		// Registered as active: heartbeats keep the lease while it is taken
		// over, and local watchers wake on its events.
		e.active[a.RunID] = newActiveRun(func(error) {})
		e.mu.Unlock()
		go func() {
			defer release()
			e.takeOver(a)
		}()
	}
}

// endOrphan ends a run adopted from prevOwner, FAILED with cause, the way every run ends
// (endRun): the ledger run is cancelled (every worker stops the run's
// subagents), reservations still held are waited for (up to HeldWait),
// the tasks that had not ended fail, what exists is joined, the ledger run
// is closed and the end recorded, so that watchers on every replica see it.
func (e *Engine) endOrphan(a runs.Adoption, cause string) {
	runID, prevOwner := a.RunID, a.PrevOwner
	defer e.forget(runID)
	log := e.cfg.Logger.With("run_id", runID, "prev_owner", prevOwner)
	var failed []*fanoutv1.TaskOutcome
	_, result, ended := e.endRun(e.base, runID, runEnd{
		state:       fanoutv1.RunState_RUN_STATE_FAILED,
		cause:       cause,
		ledgerCause: fmt.Sprintf("orchestrator %s lost", prevOwner),
		epoch:       int64(a.Adoptions), // fenced like a driver: a later adopter's run is not ended here
		result: func(ctx context.Context) (r *fanoutv1.JoinedResult, err error) {
			failed, r, err = e.failLost(ctx, runID)
			return r, err
		},
	})
	if ended {
		ctx, cancel := cleanup(e.base)
		e.childEnded(ctx, runID, fanoutv1.RunState_RUN_STATE_FAILED, result)
		cancel()
		log.Warn("adopted run ended", "state", "FAILED", "cause", cause,
			"tasks_failed", len(failed), "tokens", result.GetTotalTokens())
	}
}

// failLost fails the tasks of an adopted run that had not ended (after the
// wait for held reservations, so that their tokens are what they settled),
// reports each, and joins the run as it stands.
func (e *Engine) failLost(ctx context.Context, runID string) ([]*fanoutv1.TaskOutcome, *fanoutv1.JoinedResult, error) {
	failed, err := e.store.FailTasks(ctx, runID, e.cfg.Node, lostTaskReason)
	if err != nil {
		// The run stays RUNNING under this node; once it leaves e.active its
		// lease lapses and it is adopted again.
		return nil, nil, fmt.Errorf("fail unfinished tasks: %w", err)
	}
	for _, o := range failed {
		countTask(ctx, o) // its TaskFinished is stored with it
	}
	e.wake(runID)
	run, err := e.store.ReadRun(ctx, runID)
	if err != nil {
		return nil, nil, fmt.Errorf("read adopted run: %w", err)
	}
	result := join(run.GetTasks())
	if run.GetSpec().GetSynthesize() {
		result.SynthesisSkippedReason = "the run's orchestrator was lost before the run ended"
	}
	return failed, result, nil
}

// stopHeartbeat stops the heartbeat loop and waits for it. Idempotent.
func (e *Engine) stopHeartbeat() {
	e.stopBeat()
	<-e.beatDone
}

// awaitLease makes sure this engine still holds the run's lease before an
// attempt begins: at once when the engine's heartbeats hold it
// (leaseHeld), else by renewing this run's lease itself, every
// HeartbeatInterval until that succeeds in time, ctx ends or the run turns
// out to be another replica's (then the run is abandoned). It returns why
// it stopped waiting (nil: the lease holds).
func (d *driver) awaitLease(ctx context.Context) error {
	cfg := d.e.cfg
	for {
		if d.ar.isLost() {
			return errRunLost
		}
		if d.e.leaseHeld() {
			return nil
		}
		sent := time.Now()
		lost, err := d.e.store.Heartbeat(ctx, cfg.Node, []string{d.runID})
		switch {
		case err == nil && len(lost) > 0:
			d.lose(ctx, errRunLost)
			return errRunLost
		case err == nil && time.Since(sent) < cfg.OrphanAfter/2:
			return nil
		}
		if !sleep(ctx, cfg.HeartbeatInterval) {
			return context.Cause(ctx)
		}
	}
}
