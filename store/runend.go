package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store/internal/dbsqlc"
)

// FinishRun ends the run with a terminal state, cause and joined result,
// stamping finished_at (database time), if it is RUNNING and owner drives it
// (run.owner), and returns the run with ended true. Otherwise (the run has
// already ended, or another replica adopted it) it writes nothing and
// returns the run as stored with ended false: so exactly one caller ends a
// run and reports it. Returns runs.ErrNotFound for an unknown run.
func (s *Runs) FinishRun(ctx context.Context, runID, owner string, state fanoutv1.RunState, cause string,
	result *fanoutv1.JoinedResult) (run *fanoutv1.Run, ended bool, err error) {
	defer s.notices.announce(runID)
	// Only the owner ends a run, and once: a try after an ambiguous commit
	// that finds the run ended as this call would end it, still owned by
	// owner, was that try (finishRun).
	err = retried(ctx, s.log, "runs.finish_run", idempotent, func(ctx context.Context, t try) error {
		end, err := s.finishRun(ctx, s.pool, runID, owner, state, cause, result, t)
		ended = end.ended
		return err
	})
	if err != nil {
		return nil, false, err
	}
	run, err = s.ReadRun(ctx, runID)
	return run, err == nil && ended, err
}

// CloseRun ends the run as FinishRun does and, in the same transaction,
// first closes its ledger run (what Ledger.EndRunFenced does with
// budget.StateClosed), sets result.TotalTokens to the closed account's
// spend and appends a BudgetUpdate with that account (the run's last
// budget view) before the RunFinished: the run's close, its last budget
// view and its end cost one commit, and the end is never durable before
// the ledger's close. It returns the run's row (its state, cause and
// times, without its tasks), the closed account, or nil for a run without
// ledger accounts (then no BudgetUpdate is appended), and the events it
// appended as stored, so that the caller can hand them to its followers
// as soon as they are durable (runs.Closing). If the run changed hands
// since epoch (its owner epoch) it writes nothing and returns a
// budget.DeniedError.
func (s *Runs) CloseRun(ctx context.Context, runID, owner string, epoch int64, state fanoutv1.RunState, cause string,
	result *fanoutv1.JoinedResult) (runs.Closing, error) {
	defer s.notices.announce(runID)
	var c runs.Closing
	// As FinishRun; closing a closed run again changes nothing, and a try
	// after a lost reply that committed finds the run ended (no event is
	// appended to an ended run).
	err := retried(ctx, s.log, "runs.close_run", idempotent, func(ctx context.Context, t try) error {
		c = runs.Closing{}
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			r, err := s.q.EndRunFenced(ctx, tx, dbsqlc.EndRunFencedParams{RunID: runID,
				State: string(budget.StateClosed), Cause: "run closed", Epoch: epoch})
			a, err := readAccount(dbsqlc.AccountRow(r), err)
			switch {
			case isCode(err, "FA001"):
				return &budget.DeniedError{Reason: pgMessage(err)}
			case errors.Is(err, budget.ErrNotFound): // no accounts: nothing to close
			case err != nil:
				return err
			default:
				c.Account = &a
				if result != nil {
					result.TotalTokens = a.Spent
				}
				update, err := s.appendUpdate(ctx, tx, runID, a)
				if err != nil {
					return err
				}
				if update != nil {
					c.Events = append(c.Events, update)
				}
				// No decision reaches a write of an ended run: those
				// still waiting are denied, "run ended".
				if _, err := s.q.EndRunToolCalls(ctx, tx, runID); err != nil {
					return fmt.Errorf("deny the run's pending tool writes: %w", err)
				}
			}
			end, err := s.finishRun(ctx, tx, runID, owner, state, cause, result, t)
			if err != nil {
				return err
			}
			c.Ended = end.ended
			if !end.ended {
				c.Events = nil
				return nil
			}
			if end.finished != nil {
				c.Run = &fanoutv1.Run{RunId: runID, State: state, CancelCause: cause,
					CreatedAt: timestamppb.New(end.createdAt), FinishedAt: end.finished.GetTime()}
				c.Events = append(c.Events, end.finished)
			} else {
				c.Events = nil // a try after a lost reply: what the lost try appended is in the log
			}
			return nil
		})
	})
	if err != nil {
		return runs.Closing{}, fmt.Errorf("close run %s: %w", runID, err)
	}
	if c.Run != nil {
		return c, nil // no read after the commit: its end is all in hand
	}
	// Its row, not its tasks: reading back a wide run's outcomes would
	// delay its end for nothing.
	r, err := retry(ctx, s.log, "runs.run_end", idempotent, func(ctx context.Context, _ try) (dbsqlc.RunEndRow, error) {
		return s.q.RunEnd(ctx, s.pool, runID)
	})
	if err != nil {
		return runs.Closing{Account: c.Account}, fmt.Errorf("close run %s: read its end: %w", runID, err)
	}
	st, err := runs.ParseState(r.State)
	if err != nil {
		return runs.Closing{Account: c.Account}, fmt.Errorf("close run %s: stored state: %w", runID, err)
	}
	c.Run = &fanoutv1.Run{RunId: runID, State: st, CancelCause: r.CancelCause, CreatedAt: timestamppb.New(r.CreatedAt),
		FinishedAt: timestamp(r.FinishedAt)}
	return c, nil
}

// appendUpdate appends the run's last BudgetUpdate, with its closed
// account a, within tx and returns it as stored; nil if the run has ended
// already (a try after a lost reply).
func (s *Runs) appendUpdate(ctx context.Context, tx pgx.Tx, runID string, a budget.Account) (*fanoutv1.RunEvent, error) {
	bodies, err := encodeEvents(runID, "closing events", []*fanoutv1.RunEvent{{Event: &fanoutv1.RunEvent_BudgetUpdate{
		BudgetUpdate: &fanoutv1.BudgetUpdate{Budget: runs.Snapshot(a)}}}})
	if err != nil {
		return nil, err
	}
	seq, at, err := appendBodies(ctx, tx, runID, "closing events", bodies, []string{newEventKey()})
	switch {
	case errors.Is(err, runs.ErrEnded):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return storedEvent(runID, bodies[0], seq, at)
}

// runEnd is what one try of finishRun did: whether this call ended the
// run and, if this try wrote the end, its RunFinished as stored and the
// run's creation time.
type runEnd struct {
	ended     bool
	finished  *fanoutv1.RunEvent
	createdAt time.Time
}

// finishRun is one try of FinishRun's write, with db (the pool, or
// CloseRun's transaction): whether this call ended the run and, if this
// try wrote the end, what it wrote.
func (s *Runs) finishRun(ctx context.Context, db dbsqlc.DBTX, runID, owner string, state fanoutv1.RunState, cause string,
	result *fanoutv1.JoinedResult, t try) (runEnd, error) {
	body, err := encodeResult(result)
	if err != nil {
		return runEnd{}, fmt.Errorf("finish run %s: encode result: %w", runID, err)
	}
	if result == nil {
		body = nil
	}
	event, err := encodeEvent(&fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_RunFinished{
		RunFinished: &fanoutv1.RunFinished{State: state, CancelCause: cause, Result: result}}})
	if err != nil {
		return runEnd{}, fmt.Errorf("finish run %s: encode RunFinished: %w", runID, err)
	}
	// One statement: the final state, the result and the RunFinished event
	// commit together, so that no follower sees an ended run without its end.
	// It returns what it wrote, so that nothing is read back after the
	// commit.
	var end runEnd
	var seq int64
	var at time.Time
	err = db.QueryRow(ctx, `WITH fin AS (
			UPDATE run
			SET state = $3, cancel_cause = $4, result = $5, finished_at = now(), last_sequence = last_sequence + 1
			WHERE run_id = $1 AND owner = $2 AND state = 'RUNNING'
			RETURNING tenant_id, last_sequence, created_at),
		ins AS (
			INSERT INTO run_event (run_id, sequence, tenant_id, event)
			SELECT $1, fin.last_sequence, fin.tenant_id, $6 FROM fin
			RETURNING sequence, created_at)
		SELECT fin.created_at, ins.sequence, ins.created_at FROM fin, ins`,
		runID, owner, runs.Text(state), cause, body, event).Scan(&end.createdAt, &seq, &at)
	switch {
	case err == nil:
		end.ended = true
		if end.finished, err = storedEvent(runID, event, seq, at); err != nil {
			return runEnd{}, fmt.Errorf("finish run %s: %w", runID, err)
		}
		return end, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return runEnd{}, fmt.Errorf("finish run %s: %w", runID, err)
	}
	if t.ambiguous {
		err = db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM run
			WHERE run_id = $1 AND owner = $2 AND state = $3 AND cancel_cause = $4)`,
			runID, owner, runs.Text(state), cause).Scan(&end.ended)
		if err != nil {
			return runEnd{}, fmt.Errorf("finish run %s: re-read after a lost reply: %w", runID, err)
		}
	}
	return end, nil
}
