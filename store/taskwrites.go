package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store/internal/dbsqlc"
)

// StartTask marks a task RUNNING on started's worker and stamps started_at
// (database time) the first time, and appends the event started (its
// TaskStarted) in the same transaction, if owner drives the run; with
// group commit, the tasks that start together do so in one transaction.
// Returns runs.ErrNotFound for an unknown task, runs.ErrEnded for a task
// that has already ended and runs.ErrNotOwner when another orchestrator
// drives the run now.
func (s *Runs) StartTask(ctx context.Context, runID, owner string, started *fanoutv1.TaskStarted) (*fanoutv1.TaskOutcome, error) {
	// Idempotent by its event's key: a task already RUNNING on this worker
	// stays so, its started_at kept, and a try after an ambiguous commit
	// that finds the event stored appends it no second time. Every other
	// start is news, also a start on the worker a lost owner had started
	// the task on.
	key, skip := newEventKey(), false
	return retry(ctx, s.log, "runs.start_task", idempotent, func(ctx context.Context, t try) (*fanoutv1.TaskOutcome, error) {
		if t.ambiguous && !skip {
			found, err := s.appended(ctx, &eventOp{runID: runID, keys: []string{key}})
			if err != nil {
				return nil, err
			}
			skip = found
		}
		op, err := s.starts.do(ctx, &startOp{runID: runID, owner: owner, started: started, key: key, stored: skip})
		if err == nil {
			err = op.err
		}
		return op.out, err
	})
}

// startSQL marks one live task of a run that $4 drives RUNNING on worker
// $3. The run row is locked for the TaskStarted append that follows in
// the same transaction (which updates it), as finishSQL does.
const startSQL = `WITH owned AS (SELECT FROM run WHERE run_id = $1 AND owner = $4 FOR NO KEY UPDATE)
	UPDATE task t
	SET status = 'RUNNING', worker = $3, started_at = coalesce(t.started_at, now())
	WHERE t.run_id = $1 AND t.task_id = $2 AND t.status IN ('PENDING', 'RUNNING') AND EXISTS (SELECT FROM owned)
	RETURNING t.run_id, t.task_id, t.dispatch_index, t.status, t.outcome, t.tokens_spent, t.worker, t.started_at,
	          t.finished_at`

// startOp is one StartTask call on its way through s.starts.
type startOp struct {
	runID, owner string
	started      *fanoutv1.TaskStarted
	key          string                // its TaskStarted's event key
	stored       bool                  // its TaskStarted is stored (by a try whose reply was lost)
	out          *fanoutv1.TaskOutcome // as stored
	err          error
}

// startTask starts one task and appends its TaskStarted (unless stored),
// in one transaction.
func (s *Runs) startTask(ctx context.Context, op *startOp) (*fanoutv1.TaskOutcome, error) {
	defer s.notices.announce(op.runID)
	taskID := op.started.GetTaskId()
	var out *fanoutv1.TaskOutcome
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, startSQL, op.runID, taskID, op.started.GetWorker(), op.owner)
		var got []taskRow
		if err == nil {
			got, err = pgx.CollectRows(rows, pgx.RowToStructByName[taskRow])
		}
		switch {
		case err != nil:
			return fmt.Errorf("start task %s of run %s: %w", taskID, op.runID, err)
		case len(got) == 0:
			return s.whyNot(ctx, tx, op.runID, taskID, op.owner, "start")
		}
		if out, err = got[0].outcome(); err != nil {
			return err
		}
		if op.stored {
			return nil
		}
		return appendStarted(ctx, tx, op.runID, []*startOp{op})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// appendStarted appends the TaskStarted event of each of ops, in order and
// under its key, within tx (appendSQL).
func appendStarted(ctx context.Context, tx pgx.Tx, runID string, ops []*startOp) error {
	evs, keys := startedEvents(ops)
	return appendKeyed(ctx, tx, runID, "TaskStarted", evs, keys)
}

// startedEvents are the TaskStarted events of ops, in order, and their keys.
func startedEvents(ops []*startOp) (evs []*fanoutv1.RunEvent, keys []string) {
	evs = make([]*fanoutv1.RunEvent, len(ops))
	keys = make([]string, len(ops))
	for i, op := range ops {
		evs[i] = &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskStarted{TaskStarted: op.started}}
		keys[i] = op.key
	}
	return evs, keys
}

// runAppends are the event appends (appendSQL) of a batch of task writes,
// one per run, and, for ended tasks, the return of their budget slices
// before (returnSlicesSQL): sent in one pgx batch, so that a batch across
// many runs holds their rows for one round trip, not one per run (issue 44:
// batches holding a hundred run rows "idle in transaction" between their
// statements queued every other batch, and the heartbeat, behind them).
type runAppends struct {
	q     pgx.Batch
	reads []func(pgx.BatchResults) error // one per queued statement, in order
}

// queue queues the append of evs (of one kind, named what) to runID under keys.
func (a *runAppends) queue(runID, what string, evs []*fanoutv1.RunEvent, keys []string) error {
	bodies, err := encodeEvents(runID, what, evs)
	if err != nil {
		return err
	}
	if len(bodies) == 0 {
		return nil
	}
	a.q.Queue(appendSQL, runID, bodies, keys)
	a.reads = append(a.reads, func(br pgx.BatchResults) error {
		var state string
		var last int64
		var at time.Time
		if err := br.QueryRow().Scan(&state, &last, &at); err != nil {
			return fmt.Errorf("append %s to run %s: %w", what, runID, err)
		}
		if state != "RUNNING" {
			return fmt.Errorf("append %s to run %s: the run has ended %s: %w", what, runID, state, runs.ErrEnded)
		}
		return nil
	})
	return nil
}

// queueFinished queues what appendFinished does for outcomes of runID.
func (a *runAppends) queueFinished(runID string, outcomes []*fanoutv1.TaskOutcome) error {
	evs, ids := finishedEvents(outcomes)
	if len(ids) > 0 {
		a.q.Queue(returnSlicesSQL, runID, ids)
		a.reads = append(a.reads, func(br pgx.BatchResults) error {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("return the slices of %d tasks of run %s: %w", len(ids), runID, err)
			}
			return nil
		})
	}
	keys := make([]string, len(evs))
	for i := range keys {
		keys[i] = newEventKey()
	}
	return a.queue(runID, "TaskFinished", evs, keys)
}

// send runs the queued statements in tx, in one round trip.
func (a *runAppends) send(ctx context.Context, tx pgx.Tx) error {
	if len(a.reads) == 0 {
		return nil
	}
	br := tx.SendBatch(ctx, &a.q)
	for _, read := range a.reads {
		if err := read(br); err != nil {
			_ = br.Close()
			return err
		}
	}
	return br.Close()
}

// startBatch starts the tasks of a batch of StartTask calls in one
// transaction of two round trips, as finishBatch ends them: every task's
// UPDATE in one pgx batch, then one TaskStarted append per run for those
// not stored already, runs in id order. A call the batch did not start, and
// every call of a batch that failed as a whole, is done again on its own,
// which says why; a transient error fails every call instead.
func (s *Runs) startBatch(ctx context.Context, batch []*pending[*startOp]) {
	defer func() {
		for _, p := range batch {
			close(p.done)
		}
	}()
	defer announceRuns(s.notices, batch, func(op *startOp) string { return op.runID })
	alone := func(op *startOp) { op.out, op.err = s.startTask(ctx, op) }
	if len(batch) == 1 {
		alone(batch[0].item)
		return
	}
	slices.SortStableFunc(batch, func(a, b *pending[*startOp]) int { return strings.Compare(a.item.runID, b.item.runID) })
	var redo []*startOp
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		redo = redo[:0]
		q := &pgx.Batch{}
		for _, p := range batch {
			op := p.item
			op.out, op.err = nil, nil
			q.Queue(startSQL, op.runID, op.started.GetTaskId(), op.started.GetWorker(), op.owner)
		}
		br := tx.SendBatch(ctx, q)
		for _, p := range batch {
			op := p.item
			rows, err := br.Query()
			var got []taskRow
			if err == nil {
				got, err = pgx.CollectRows(rows, pgx.RowToStructByName[taskRow])
			}
			if err == nil && len(got) > 0 {
				op.out, err = got[0].outcome()
			}
			if err != nil {
				_ = br.Close()
				return err
			}
			if len(got) == 0 {
				redo = append(redo, op) // startTask says why
			}
		}
		if err := br.Close(); err != nil {
			return err
		}
		appends := &runAppends{}
		for i := 0; i < len(batch); {
			j := i
			var started []*startOp
			for ; j < len(batch) && batch[j].item.runID == batch[i].item.runID; j++ {
				if op := batch[j].item; op.out != nil && !op.stored {
					started = append(started, op)
				}
			}
			if len(started) > 0 {
				evs, keys := startedEvents(started)
				if err := appends.queue(batch[i].item.runID, "TaskStarted", evs, keys); err != nil {
					return err
				}
			}
			i = j
		}
		return appends.send(ctx, tx)
	})
	switch class, _ := classify(err); {
	case err == nil:
		for _, op := range redo {
			alone(op)
		}
	case class != permanent:
		for _, p := range batch {
			p.item.out, p.item.err = nil, err
		}
	default:
		for _, p := range batch {
			alone(p.item)
		}
	}
}

// FinishTask stores a task's terminal outcome (status, summary, tokens,
// worker), stamps finished_at (database time) and appends its TaskFinished
// event, in one transaction, if owner drives the run. It returns the
// stored outcome with its timestamps. A terminal outcome is
// final: returns runs.ErrEnded for a task that has already ended,
// runs.ErrNotOwner when another orchestrator drives the run now,
// runs.ErrNotFound for an unknown task.
func (s *Runs) FinishTask(ctx context.Context, runID, owner string, o *fanoutv1.TaskOutcome) (*fanoutv1.TaskOutcome, error) {
	// A task ends once, so a try after an ambiguous commit that finds it
	// ended re-reads it: ended with this very outcome, it was that try.
	return retry(ctx, s.log, "runs.finish_task", idempotent, func(ctx context.Context, t try) (*fanoutv1.TaskOutcome, error) {
		op, err := s.finishes.do(ctx, &finishOp{runID: runID, owner: owner, o: o})
		out := op.out
		if err == nil {
			err = op.err
		}
		if t.ambiguous && errors.Is(err, runs.ErrEnded) {
			if mine, rerr := s.finishedAs(ctx, runID, o); mine != nil || rerr != nil {
				return mine, rerr
			}
		}
		return out, err
	})
}

// finishedAs returns the task of o as stored if it ended with o's
// status, outcome, tokens and worker, or nil.
func (s *Runs) finishedAs(ctx context.Context, runID string, o *fanoutv1.TaskOutcome) (*fanoutv1.TaskOutcome, error) {
	stored := proto.CloneOf(o)
	stored.StartedAt, stored.FinishedAt = nil, nil
	body, err := encodeOutcome(stored)
	if err != nil {
		return nil, fmt.Errorf("finish task %s of run %s: encode outcome: %w", o.GetTaskId(), runID, err)
	}
	rows, err := s.pool.Query(ctx, `SELECT run_id, task_id, dispatch_index, status, outcome, tokens_spent, worker,
			started_at, finished_at FROM task
		WHERE run_id = $1 AND task_id = $2 AND status = $3 AND outcome = $4 AND tokens_spent = $5 AND worker = $6`,
		runID, o.GetTaskId(), runs.Text(o.GetStatus()), body, o.GetTokensSpent(), o.GetWorker())
	var row taskRow
	if err == nil {
		row, err = pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[taskRow])
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("finish task %s of run %s: re-read after a lost reply: %w", o.GetTaskId(), runID, err)
	}
	return row.outcome()
}

// finishSQL ends one live task of a run that $7 drives. The run row is
// locked for the append that follows (which updates it): taken FOR SHARE
// here, two FinishTasks of a run would deadlock upgrading their locks.
const finishSQL = `WITH owned AS (SELECT FROM run WHERE run_id = $1 AND owner = $7 FOR NO KEY UPDATE)
		UPDATE task
		SET status = $3, outcome = $4, tokens_spent = $5, worker = $6, finished_at = now()
		WHERE run_id = $1 AND task_id = $2 AND status IN ('PENDING', 'RUNNING') AND EXISTS (SELECT FROM owned)
		RETURNING run_id, task_id, dispatch_index, status, outcome, tokens_spent, worker, started_at, finished_at`

// finishOp is one FinishTask call on its way through s.finishes.
type finishOp struct {
	runID, owner string
	o            *fanoutv1.TaskOutcome
	out          *fanoutv1.TaskOutcome // as stored
	err          error
}

// finishArgs are finishSQL's arguments for o, whose outcome is stored
// without its times (the columns hold them).
func finishArgs(runID, owner string, o *fanoutv1.TaskOutcome) ([]any, error) {
	stored := proto.CloneOf(o)
	stored.StartedAt, stored.FinishedAt = nil, nil
	body, err := encodeOutcome(stored)
	if err != nil {
		return nil, fmt.Errorf("finish task %s of run %s: encode outcome: %w", o.GetTaskId(), runID, err)
	}
	return []any{runID, o.GetTaskId(), runs.Text(o.GetStatus()), body, o.GetTokensSpent(), o.GetWorker(), owner}, nil
}

// finishTask ends one task: its outcome and its TaskFinished event in one
// transaction, so that no follower (nor the replica that adopts the run)
// sees a task ended without its event.
func (s *Runs) finishTask(ctx context.Context, runID, owner string, o *fanoutv1.TaskOutcome) (*fanoutv1.TaskOutcome, error) {
	defer s.notices.announce(runID)
	args, err := finishArgs(runID, owner, o)
	if err != nil {
		return nil, err
	}
	var out *fanoutv1.TaskOutcome
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, finishSQL, args...)
		if out, err = s.taskResult(ctx, tx, rows, err, runID, o.GetTaskId(), owner, "finish"); err != nil {
			return err
		}
		return appendFinished(ctx, tx, runID, []*fanoutv1.TaskOutcome{out})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// finishBatch ends the tasks of a batch of FinishTask calls in one
// transaction of two round trips: every task's UPDATE in one pgx batch,
// then one TaskFinished append per run (appendSQL) with all its tasks'
// events, runs in id order (so run rows are locked in one order, as
// appendBatch does). A run row is locked and its commit waited for once per
// batch, where one transaction per task queued them on the row one after
// another. A call whose task the batch did not end (unknown, ended, or a
// run another replica drives) and every call of a batch that failed as a
// whole (a run that ended under it, a server error) is done again on its
// own, which says why; a transient error fails every call instead, for
// FinishTask to retry under its caller's deadline.
func (s *Runs) finishBatch(ctx context.Context, batch []*pending[*finishOp]) {
	defer func() {
		for _, p := range batch {
			close(p.done)
		}
	}()
	defer announceRuns(s.notices, batch, func(op *finishOp) string { return op.runID })
	alone := func(op *finishOp) { op.out, op.err = s.finishTask(ctx, op.runID, op.owner, op.o) }
	if len(batch) == 1 {
		alone(batch[0].item)
		return
	}
	slices.SortStableFunc(batch, func(a, b *pending[*finishOp]) int { return strings.Compare(a.item.runID, b.item.runID) })
	var redo []*finishOp
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		redo = redo[:0]
		q := &pgx.Batch{}
		var queued []*finishOp
		for _, p := range batch {
			op := p.item
			op.out, op.err = nil, nil
			args, err := finishArgs(op.runID, op.owner, op.o)
			if err != nil {
				op.err = err
				continue
			}
			q.Queue(finishSQL, args...)
			queued = append(queued, op)
		}
		br := tx.SendBatch(ctx, q)
		for _, op := range queued {
			rows, err := br.Query()
			var row []taskRow
			if err == nil {
				row, err = pgx.CollectRows(rows, pgx.RowToStructByName[taskRow])
			}
			if err != nil {
				_ = br.Close()
				return err
			}
			if len(row) == 0 {
				redo = append(redo, op) // finishTask says why
				continue
			}
			if op.out, err = row[0].outcome(); err != nil {
				_ = br.Close()
				return err
			}
		}
		if err := br.Close(); err != nil {
			return err
		}
		appends := &runAppends{}
		for i := 0; i < len(queued); {
			j := i
			var outs []*fanoutv1.TaskOutcome
			for ; j < len(queued) && queued[j].runID == queued[i].runID; j++ {
				if queued[j].out != nil {
					outs = append(outs, queued[j].out)
				}
			}
			if err := appends.queueFinished(queued[i].runID, outs); err != nil {
				return err
			}
			i = j
		}
		return appends.send(ctx, tx)
	})
	switch class, _ := classify(err); {
	case err == nil:
		for _, op := range redo {
			alone(op)
		}
	case class != permanent:
		for _, p := range batch {
			if p.item.err == nil {
				p.item.out, p.item.err = nil, err
			}
		}
	default:
		for _, p := range batch {
			if p.item.err == nil {
				alone(p.item)
			}
		}
	}
}

// appendFinished appends a TaskFinished event for each of outcomes, in
// order, within tx (appendSQL, as AppendEvents does), and gives back to the
// run what those tasks' budget slices did not use (returnSlicesSQL).
func appendFinished(ctx context.Context, tx pgx.Tx, runID string, outcomes []*fanoutv1.TaskOutcome) error {
	evs, ids := finishedEvents(outcomes)
	if len(ids) > 0 {
		if _, err := tx.Exec(ctx, returnSlicesSQL, runID, ids); err != nil {
			return fmt.Errorf("return the slices of %d tasks of run %s: %w", len(ids), runID, err)
		}
	}
	return appendInTx(ctx, tx, runID, "TaskFinished", evs)
}

// finishedEvents are the TaskFinished events of outcomes, in order, and
// their tasks' ids.
func finishedEvents(outcomes []*fanoutv1.TaskOutcome) (evs []*fanoutv1.RunEvent, ids []string) {
	evs = make([]*fanoutv1.RunEvent, len(outcomes))
	ids = make([]string, len(outcomes))
	for i, o := range outcomes {
		evs[i] = &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskFinished{TaskFinished: &fanoutv1.TaskFinished{Outcome: o}}}
		ids[i] = o.GetTaskId()
	}
	return evs, ids
}

// returnSlicesSQL gives back what the ended tasks' budget slices did not
// use, and posts what they spent, to their run's account and its tenant's
// (docs/ledger.md#budget-slices), in the transaction that ends them.
const returnSlicesSQL = `SELECT ledger_return_slices($1, $2)`

// The fenced task writes (StartTask, FinishTask, FailTasks) stay
// hand-written: each is one statement whose CTE "owned" selects the run
// only if the writing node drives it (run.owner), and holds the run's row
// (FOR SHARE, or FOR NO KEY UPDATE in a transaction that updates the row
// next) until the statement's transaction ends: an adoption (which updates
// the row's owner) waits for a task write of the old owner under way, and
// a task write that waited on an adoption sees the new owner. So once
// AdoptOrphan has returned, the old owner writes none of the run's tasks,
// and the adopter reads every task the old owner wrote. They return
// taskRow's columns, read by name.

// taskResult reads the task an UPDATE of one live task of a run that owner
// drives returned, reading with q (the UPDATE's pool or transaction). No row means an unknown task (runs.ErrNotFound), one
// that has already ended (runs.ErrEnded) or a run that another owner
// drives now (runs.ErrNotOwner).
//
// A transaction's own connection must do the reads (q is the UPDATE's pool
// or transaction), or each refused call would hold two of the pool's
// connections at once and a few of them would starve the pool.
func (s *Runs) taskResult(ctx context.Context, q dbsqlc.DBTX, rows pgx.Rows, err error, runID, taskID, owner, verb string) (*fanoutv1.TaskOutcome, error) {
	if err != nil {
		return nil, fmt.Errorf("%s task %s of run %s: %w", verb, taskID, runID, err)
	}
	row, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[taskRow])
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, s.whyNot(ctx, q, runID, taskID, owner, verb)
	}
	if err != nil {
		return nil, fmt.Errorf("%s task %s of run %s: %w", verb, taskID, runID, err)
	}
	return row.outcome()
}

// whyNot says why a fenced write of one live task (verb: "start",
// "finish") changed no row, reading with q: an unknown task
// (runs.ErrNotFound), a run another owner drives now (runs.ErrNotOwner),
// or a task that has already ended (runs.ErrEnded).
func (s *Runs) whyNot(ctx context.Context, q dbsqlc.DBTX, runID, taskID, owner, verb string) error {
	found, err := s.q.TaskStatusAndOwner(ctx, q, dbsqlc.TaskStatusAndOwnerParams{RunID: runID, TaskID: taskID})
	status, runOwner := found.Status, found.Owner
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%s task %s of run %s: %w", verb, taskID, runID, runs.ErrNotFound)
	case err != nil:
		return fmt.Errorf("%s task %s of run %s: %w", verb, taskID, runID, err)
	case runOwner != owner:
		return fmt.Errorf("%s task %s of run %s: %s drives it now: %w", verb, taskID, runID, runOwner, runs.ErrNotOwner)
	}
	return fmt.Errorf("%s task %s of run %s: it already ended %s: %w", verb, taskID, runID, status, runs.ErrEnded)
}

// FailTasks ends every PENDING or RUNNING task of the run as FAILED, with
// reason as its summary's error and the spend its ledger task account shows
// as its tokens, stamping finished_at (database time) and appending their
// TaskFinished events, in one transaction, if owner drives the run (else
// it ends nothing). Tasks that have ended
// keep their outcomes. It returns the tasks it ended, in dispatch order. An
// unknown run has no tasks to end.
func (s *Runs) FailTasks(ctx context.Context, runID, owner, reason string) ([]*fanoutv1.TaskOutcome, error) {
	body, err := encodeOutcome(&fanoutv1.TaskOutcome{Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED,
		Summary: &fanoutv1.FactSummary{Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED, Error: reason}})
	if err != nil {
		return nil, fmt.Errorf("fail tasks of run %s: encode outcome: %w", runID, err)
	}
	// Idempotent: ended tasks are left as they are. A try after an
	// ambiguous commit that ends none re-reads the tasks failed with this
	// very outcome, which that try ended.
	taskRows, err := retry(ctx, s.log, "runs.fail_tasks", idempotent, func(ctx context.Context, t try) ([]taskRow, error) {
		taskRows, err := s.failTasks(ctx, runID, owner, body)
		if err != nil || len(taskRows) > 0 || !t.ambiguous {
			return taskRows, err
		}
		rows, err := s.pool.Query(ctx, `SELECT run_id, task_id, dispatch_index, status, outcome, tokens_spent, worker,
				started_at, finished_at FROM task
			WHERE run_id = $1 AND status = 'FAILED' AND outcome = $2`, runID, body)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowToStructByName[taskRow])
	})
	if err != nil {
		return nil, fmt.Errorf("fail tasks of run %s: %w", runID, err)
	}
	slices.SortFunc(taskRows, func(a, b taskRow) int { return int(a.DispatchIndex - b.DispatchIndex) })
	out := make([]*fanoutv1.TaskOutcome, len(taskRows))
	for i, r := range taskRows {
		if out[i], err = r.outcome(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// failTasks is one try of FailTasks: the unfinished tasks end FAILED with
// the outcome body and their TaskFinished events are appended, in one
// transaction.
func (s *Runs) failTasks(ctx context.Context, runID, owner string, body []byte) (taskRows []taskRow, err error) {
	defer s.notices.announce(runID)
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The run row first, as FinishTask takes it: one lock order (run,
		// then tasks) for every task write.
		rows, err := tx.Query(ctx, `WITH owned AS (SELECT FROM run WHERE run_id = $1 AND owner = $3 FOR NO KEY UPDATE)
			UPDATE task t
			SET status = 'FAILED', outcome = $2, finished_at = now(),
			    tokens_spent = coalesce((SELECT a.spent FROM account a
			        WHERE a.kind = 'task' AND a.run_id = t.run_id AND a.task_id = t.task_id), t.tokens_spent)
			WHERE t.run_id = $1 AND t.status IN ('PENDING', 'RUNNING') AND EXISTS (SELECT FROM owned)
			RETURNING t.run_id, t.task_id, t.dispatch_index, t.status, t.outcome, t.tokens_spent, t.worker,
				t.started_at, t.finished_at`, runID, body, owner)
		if err != nil {
			return err
		}
		if taskRows, err = pgx.CollectRows(rows, pgx.RowToStructByName[taskRow]); err != nil {
			return err
		}
		slices.SortFunc(taskRows, func(a, b taskRow) int { return int(a.DispatchIndex - b.DispatchIndex) })
		outcomes := make([]*fanoutv1.TaskOutcome, len(taskRows))
		for i, r := range taskRows {
			if outcomes[i], err = r.outcome(); err != nil {
				return err
			}
		}
		return appendFinished(ctx, tx, runID, outcomes)
	})
	return taskRows, err
}
