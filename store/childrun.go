package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store/internal/dbsqlc"
)

// Child runs (docs/ledger.md#child-runs): a run carved from one task of
// another run, funded by one reservation on that task that only an
// orchestrator's login resolves.
const (
	openChildSQL = resultColumns +
		`ledger_open_child_run($1, $2, $3, $4, $5, $6, $7, $8::text[], $9::bigint[], $10::bigint[])`
	settleFundingSQL = resultColumns + `ledger_settle_funding($1)`
)

// OpenChildRun opens the child run p describes, carved from what its
// parent task has left, and returns its funding reservation (whose Amount
// is the child's limit) and its accounts. Idempotent by p.RunID. A parent
// task that cannot grant p.Min is a *budget.ExhaustedError, and nothing
// is written.
func (l *Ledger) OpenChildRun(ctx context.Context, p budget.OpenChildRunParams) (budget.Reservation, budget.RunAccounts, error) {
	if err := p.Validate(); err != nil {
		return budget.Reservation{}, budget.RunAccounts{}, err
	}
	ids, limits, slices := taskArrays(p.Tasks)
	// A second open of the same child at the same moment is rolled back
	// (serialization_failure) and retried, and then answered with the
	// first's funding (replay).
	r, err := retry(ctx, l.log, "ledger.open_child_run", idempotent, func(ctx context.Context, _ try) (ledgerResult, error) {
		var r ledgerResult
		err := r.scan(l.pool.QueryRow(ctx, openChildSQL, p.RunID, p.TenantID, int64(p.ParentTask), p.Attempt,
			p.Want, p.Min, p.TTL, ids, limits, slices))
		return r, err
	})
	if err == nil {
		err = r.err(0, p.Min)
	}
	if err != nil {
		return budget.Reservation{}, budget.RunAccounts{}, fmt.Errorf("open child run %s under task account %d: %w",
			p.RunID, p.ParentTask, err)
	}
	accounts, err := l.runAccounts(ctx, p.RunID)
	if err != nil {
		return budget.Reservation{}, budget.RunAccounts{}, fmt.Errorf("open child run %s: %w", p.RunID, err)
	}
	return r.reservation(), accounts, nil
}

// SettleFunding posts what the closed child run runID spent on its parent
// task: its funding reservation is settled at the child's spent, and the
// rest goes back to the task and every account above it. Idempotent. A
// child that has not closed is a *budget.ConflictError; a run that is not
// a child, budget.ErrNotFound.
func (l *Ledger) SettleFunding(ctx context.Context, runID string) (budget.Reservation, error) {
	r, err := retry(ctx, l.log, "ledger.settle_funding", idempotent, func(ctx context.Context, _ try) (ledgerResult, error) {
		var r ledgerResult
		err := r.scan(l.pool.QueryRow(ctx, settleFundingSQL, runID))
		return r, err
	})
	if err == nil {
		err = r.err(budget.ReservationID(val(r.ReservationID)), 0)
	}
	if err != nil {
		return r.reservation(), fmt.Errorf("settle the funding of child run %s: %w", runID, err)
	}
	return r.reservation(), nil
}

// openChildIn opens the child run p describes (p.Child set) in db, the
// transaction that creates its run (Runs.OpenRun): its funding on the
// parent task, then its accounts, limited to what the parent granted.
func openChildIn(ctx context.Context, q *dbsqlc.Queries, db dbsqlc.DBTX, p budget.OpenRunParams) (budget.RunAccounts, error) {
	c := p.Child
	ids, limits, slices := taskArrays(p.Tasks)
	var r ledgerResult
	err := r.scan(db.QueryRow(ctx, openChildSQL, p.RunID, p.TenantID, int64(c.ParentTask), c.Attempt,
		p.Limit, c.Min, c.TTL, ids, limits, slices))
	if err == nil {
		err = r.err(0, c.Min)
	}
	if err != nil {
		return budget.RunAccounts{}, fmt.Errorf("open child run %s under task account %d: %w", p.RunID, c.ParentTask, err)
	}
	return readRunAccounts(ctx, q, db, p.RunID)
}

// ChildLink returns the parent of run runID, if it is a child run: the
// run and task that started it and the fan_out call it answers. A root
// run's is empty; an unknown run is runs.ErrNotFound.
func (s *Runs) ChildLink(ctx context.Context, runID string) (runs.ChildLink, error) {
	return retry(ctx, s.log, "runs.child_link", idempotent, func(ctx context.Context, _ try) (runs.ChildLink, error) {
		var l runs.ChildLink
		err := s.pool.QueryRow(ctx, `SELECT coalesce(parent_run_id, ''), coalesce(parent_task_id, ''), coalesce(parent_call, '')
			FROM run WHERE run_id = $1`, runID).Scan(&l.ParentRunID, &l.ParentTaskID, &l.Call)
		if errors.Is(err, pgx.ErrNoRows) {
			return l, fmt.Errorf("run %s: %w", runID, runs.ErrNotFound)
		}
		return l, err
	})
}

// RunningChildren returns the ids of the child runs of task taskID of run
// runID that are still running.
func (s *Runs) RunningChildren(ctx context.Context, runID, taskID string) ([]string, error) {
	return retry(ctx, s.log, "runs.running_children", idempotent, func(ctx context.Context, _ try) ([]string, error) {
		rows, err := s.pool.Query(ctx, `SELECT run_id FROM run WHERE parent_run_id = $1 AND parent_task_id = $2
			AND state = 'RUNNING' ORDER BY run_id`, runID, taskID)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowTo[string])
	})
}

// FanOutCall reports whether key is a fan_out call of task taskID of run
// runID, and whether it is still issued (its child has not answered).
func (s *Runs) FanOutCall(ctx context.Context, runID, taskID, key string) (found, issued bool, err error) {
	err = retried(ctx, s.log, "runs.fan_out_call", idempotent, func(ctx context.Context, _ try) error {
		var state string
		err := s.pool.QueryRow(ctx, `SELECT state FROM tool_call WHERE key = $1 AND run_id = $2 AND task_id = $3
			AND tool = $4`, key, runID, taskID, runs.FanOutTool).Scan(&state)
		if errors.Is(err, pgx.ErrNoRows) {
			found, issued = false, false
			return nil
		}
		found, issued = err == nil, state == string(runs.WriteIssued)
		return err
	})
	return found, issued, err
}

// AnswerCall resolves the fan_out call key of task taskID of run runID, if
// it is still issued: done with answer as its result, or, with refusal
// set, failed with refusal as its error. An orchestrator's login resolves
// any call (ledger_secret_ok): the run, task and tool named here are what
// keep it to the one it means.
func (s *Runs) AnswerCall(ctx context.Context, runID, taskID, key, answer, refusal string) error {
	state := runs.WriteDone
	if refusal != "" {
		state = runs.WriteFailed
	}
	return retried(ctx, s.log, "runs.answer_call", idempotent, func(ctx context.Context, _ try) error {
		_, err := s.pool.Exec(ctx, `SELECT tool_call_resolve(key, $2, $3, $4) FROM tool_call
			WHERE key = $1 AND run_id = $5 AND task_id = $6 AND tool = $7 AND state = 'issued'`,
			key, string(state), storedText(answer), storedText(refusal), runID, taskID, runs.FanOutTool)
		return err
	})
}
