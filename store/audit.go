package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fanout/fanout/runs"
)

// RunSpend is one row of the run_spend view.
type RunSpend struct {
	TenantID     string `json:"tenant_id"`
	RunID        string `json:"run_id"`
	State        string `json:"state"`
	Cause        string `json:"cause,omitempty"`
	Limit        int64  `json:"limit_tokens"`
	Spent        int64  `json:"spent_tokens"`
	Reported     int64  `json:"reported_tokens"`
	Estimated    int64  `json:"estimated_tokens"`
	Overrun      int64  `json:"overrun_tokens"`
	Reserved     int64  `json:"reserved_tokens"`
	Available    int64  `json:"available_tokens"`
	Reservations int64  `json:"reservations"`
}

// TaskSpend is one row of the task_spend view.
type TaskSpend struct {
	TaskID       string `json:"task_id"`
	Limit        int64  `json:"limit_tokens"`
	Spent        int64  `json:"spent_tokens"`
	Reported     int64  `json:"reported_tokens"`
	Estimated    int64  `json:"estimated_tokens"`
	Overrun      int64  `json:"overrun_tokens"`
	Reserved     int64  `json:"reserved_tokens"`
	Reservations int64  `json:"reservations"`
}

// RunAudit is what an auditor sees of one run.
type RunAudit struct {
	Run      RunSpend    `json:"run"`
	Tasks    []TaskSpend `json:"tasks"`
	Accounts int         `json:"accounts_checked"`       // accounts of the run checked by conservation_check
	Broken   int         `json:"accounts_not_conserved"` // of which not conserved (0 on a healthy ledger)
}

// AuditRun reads one run's spend exactly as an auditor would: as the role
// fanout_auditor, through the audit views only. ErrNotFound if the tenant
// has no such run.
func AuditRun(ctx context.Context, pool *pgxpool.Pool, tenantID, runID string) (RunAudit, error) {
	var a RunAudit
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL ROLE fanout_auditor"); err != nil {
			return err
		}
		r := &a.Run
		err := tx.QueryRow(ctx, `SELECT tenant_id, run_id, state, cause, limit_tokens, spent_tokens,
			reported_tokens, estimated_tokens, overrun_tokens, reserved_tokens, available_tokens, reservations
			FROM run_spend WHERE tenant_id = $1 AND run_id = $2`, tenantID, runID).Scan(
			&r.TenantID, &r.RunID, &r.State, &r.Cause, &r.Limit, &r.Spent, &r.Reported, &r.Estimated,
			&r.Overrun, &r.Reserved, &r.Available, &r.Reservations)
		if errors.Is(err, pgx.ErrNoRows) {
			return runs.ErrNotFound
		}
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT task_id, limit_tokens, spent_tokens, reported_tokens, estimated_tokens,
			overrun_tokens, reserved_tokens, reservations
			FROM task_spend WHERE tenant_id = $1 AND run_id = $2 ORDER BY task_id`, tenantID, runID)
		if err != nil {
			return err
		}
		a.Tasks, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (TaskSpend, error) {
			var t TaskSpend
			err := row.Scan(&t.TaskID, &t.Limit, &t.Spent, &t.Reported, &t.Estimated, &t.Overrun, &t.Reserved, &t.Reservations)
			return t, err
		})
		if err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE NOT conserved)
			FROM conservation_check WHERE tenant_id = $1 AND run_id = $2`, tenantID, runID).Scan(&a.Accounts, &a.Broken)
	})
	if err != nil {
		return a, fmt.Errorf("audit run %s of tenant %s: %w", runID, tenantID, err)
	}
	return a, nil
}
