package store

import (
	"context"
	"fmt"

	"github.com/fanout/fanout/budget"
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
