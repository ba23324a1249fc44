package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// ContinueRun records a continuation (ledger_continue_run) and, when it is
// new, appends its RunContinued event in the same transaction: the
// ledger's entries, the continuation's row, a reopened run's rows and the
// event commit together (docs/budget.md#continue). A retry with the
// continuation's key returns the first one's record (Replay) and writes
// nothing. Refusals are a *runs.ContinueError; an unknown run (or another
// tenant's) is runs.ErrNotFound.
func (s *Runs) ContinueRun(ctx context.Context, c runs.Continue) (runs.Continued, error) {
	defer s.notices.announce(c.RunID)
	var out runs.Continued
	err := retried(ctx, s.log, "runs.continue_run", idempotent, func(ctx context.Context, _ try) error {
		out = runs.Continued{}
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			var outcome string
			var info *string
			var tokens *int64
			k := &fanoutv1.RunContinued{Actor: c.Actor, Reason: c.Reason}
			// A run that ended runs again if the ledger reopens it: its
			// tenant's max_concurrent_runs counts it as a new run (under
			// the tenant's lock, as CreateRun counts; no key: none is
			// taken).
			var state string
			if err := tx.QueryRow(ctx, `SELECT state FROM run WHERE run_id = $1 AND tenant_id = $2`, c.RunID, c.TenantID).
				Scan(&state); err == nil && state == "BUDGET_EXHAUSTED" {
				if err := s.checkConcurrentRuns(ctx, tx, &fanoutv1.Run{TenantId: c.TenantID}); err != nil {
					return err
				}
			}
			err := tx.QueryRow(ctx, `SELECT outcome, seq, added_tokens, limit_after, spent_before, reopened, task_ids,
				       epoch, info, info_tokens
				  FROM ledger_continue_run($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
				c.RunID, c.TenantID, c.Key, c.Add, c.Held, c.Tasks, c.Owner, c.Actor, c.Reason, c.MaxLimit).
				Scan(&outcome, &k.Continuation, &k.AddedTokens, &k.LimitTokens, &k.SpentBefore, &k.Reopened,
					&k.TaskIds, &out.Epoch, &info, &tokens)
			if err != nil {
				return fmt.Errorf("continue run %s: %w", c.RunID, err)
			}
			switch outcome {
			case "ok":
			case "replay":
				out.Replay, out.Continuation = true, k
				return nil
			case "not_found":
				return runs.ErrNotFound
			default:
				e := &runs.ContinueError{Outcome: outcome, Added: k.GetAddedTokens()}
				if info != nil {
					e.State = *info
				}
				if tokens != nil {
					e.Tokens = *tokens
				}
				return e
			}
			out.Continuation = k
			ev := &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_RunContinued{RunContinued: k}}
			bodies, err := encodeEvents(c.RunID, "RunContinued", []*fanoutv1.RunEvent{ev})
			if err != nil {
				return err
			}
			seq, at, err := appendBodies(ctx, tx, c.RunID, "RunContinued", bodies, []string{newEventKey()})
			if err != nil {
				return err
			}
			out.Event, err = storedEvent(c.RunID, bodies[0], seq, at)
			return err
		})
	})
	var refused *runs.ContinueError
	if err != nil && !errors.Is(err, runs.ErrNotFound) && !errors.As(err, &refused) {
		return runs.Continued{}, err
	}
	return out, err
}

// Continuation returns the continuation of runID made with key, as its
// RunContinued event said it; runs.ErrNotFound when the key was not used
// on the run. The caller has checked the run's tenant.
func (s *Runs) Continuation(ctx context.Context, runID, key string) (*fanoutv1.RunContinued, error) {
	k := &fanoutv1.RunContinued{}
	err := retried(ctx, s.log, "runs.continuation", idempotent, func(ctx context.Context, _ try) error {
		return s.pool.QueryRow(ctx, `SELECT seq, added_tokens, limit_after, spent_before, reopened, task_ids, actor, reason
			  FROM run_continuation WHERE run_id = $1 AND idempotency_key = $2`, runID, key).
			Scan(&k.Continuation, &k.AddedTokens, &k.LimitTokens, &k.SpentBefore, &k.Reopened, &k.TaskIds, &k.Actor, &k.Reason)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, runs.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read continuation %q of run %s: %w", key, runID, err)
	}
	return k, nil
}
