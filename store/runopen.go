package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store/internal/dbsqlc"
	"github.com/fanout/fanout/tenant"
)

// CreateRun stores run (run_id, tenant_id, idempotency_key, spec, labels and
// its tasks in dispatch order) in state RUNNING with every task PENDING, and
// returns it with created_at set and created true. If the tenant already has
// a run with the same idempotency key, it writes nothing and returns that
// run with created false; comparing specs is the caller's business.
func (s *Runs) CreateRun(ctx context.Context, run *fanoutv1.Run, owner string) (*fanoutv1.Run, bool, error) {
	a, err := newRunArgs(run)
	if err != nil {
		return nil, false, err
	}
	var created bool
	var existingID string
	// Idempotent by the idempotency key; a try after an ambiguous commit
	// that finds the key taken by this very run id made the run itself.
	err = retried(ctx, s.log, "runs.create_run", idempotent, func(ctx context.Context, t try) error {
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) (err error) {
			created, existingID, _, err = s.createRun(ctx, tx, run, a, owner, nil)
			return err
		})
		if err == nil && t.ambiguous && !created && existingID == run.GetRunId() {
			created = true
		}
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("create run %s: %w", run.GetRunId(), err)
	}
	id := run.GetRunId()
	if !created {
		id = existingID
	}
	out, err := s.GetRun(ctx, run.GetTenantId(), id)
	return out, created, err
}

// OpenRun creates run as CreateRun does and, when it creates it, in the
// same transaction opens its ledger accounts as open says (what
// Ledger.OpenRun does) and appends the run's first events: its RunStarted
// (the run as stored, with its account's budget) and then queued (the
// first wave's TaskQueued, which the caller's plan knows). A run is never
// stored without its accounts and its first events, and the three cost one
// commit. It also begins the first attempt of each task named in begin
// (accounts.Attempts), so that the run's first dispatches cost no write of
// their own. A run the tenant already has under run's idempotency key is
// returned as CreateRun returns it (created false, no accounts); a refusal
// of the ledger writes nothing (budget.ErrNotFound for an unknown tenant
// account, a budget.ValidationError for one that cannot hold the run).
// tools is the run's tool policy, recorded in the same transaction
// (run_tool_policy), where no worker's login can change it.
//
// keys are the tasks' content keys by dispatch index ("" or none: no
// key), stored for the result cache (docs/budget.md#the-result-cache). A
// task of run that has ended already (a task that reuses another's facts,
// TaskOutcome.reused) is stored ended, with its TaskFinished after the
// RunStarted, in the same write; run.forked_from is stored with the run.
func (s *Runs) OpenRun(ctx context.Context, run *fanoutv1.Run, owner string, open budget.OpenRunParams,
	tools []runs.ToolPolicy, keys []string, begin []string, queued []*fanoutv1.RunEvent) (
	stored *fanoutv1.Run, accounts budget.RunAccounts, created bool, err error) {
	if open.RunID != run.GetRunId() || open.TenantID != run.GetTenantId() {
		return nil, accounts, false, fmt.Errorf("open run %s of tenant %s: its accounts are of run %s of tenant %s",
			run.GetRunId(), run.GetTenantId(), open.RunID, open.TenantID)
	}
	if err := open.Validate(); err != nil {
		return nil, accounts, false, err
	}
	a, err := newRunArgs(run)
	if err != nil {
		return nil, accounts, false, err
	}
	var existingID string
	// As CreateRun: a try after an ambiguous commit that finds the key
	// taken by this very run id made the run, its accounts and its events.
	err = retried(ctx, s.log, "runs.open_run", idempotent, func(ctx context.Context, t try) error {
		stored = nil
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			var createdAt time.Time
			var err error
			created, existingID, createdAt, err = s.createRun(ctx, tx, run, a, owner, open.Child)
			if err != nil || !created {
				return err
			}
			stored = proto.CloneOf(run)
			if open.Child != nil {
				accounts, err = openChildIn(ctx, s.q, tx, open)
				if err == nil {
					err = s.specGranted(ctx, tx, stored, accounts.Run.Limit)
				}
			} else if accounts, err = openRunIn(ctx, s.q, tx, open); err != nil {
				err = openRunError(open, err)
			}
			if err != nil {
				return err
			}
			if accounts.Attempts, err = beginAttempts(ctx, tx, open, accounts, begin); err != nil {
				return err
			}
			if err := s.recordToolPolicy(ctx, tx, open, tools); err != nil {
				return err
			}
			if len(keys) > 0 {
				if err := s.q.SetContentKeys(ctx, tx, dbsqlc.SetContentKeysParams{RunID: run.GetRunId(), ContentKeys: keys}); err != nil {
					return fmt.Errorf("store the content keys of run %s: %w", run.GetRunId(), err)
				}
			}
			stored.CreatedAt = timestamppb.New(createdAt)
			ended, err := endReused(ctx, tx, stored, owner)
			if err != nil {
				return err
			}
			return appendInTx(ctx, tx, run.GetRunId(), "first events", firstEvents(stored, accounts, append(ended, queued...)))
		})
		if err == nil && t.ambiguous && !created && existingID == run.GetRunId() {
			created = true
		}
		return err
	})
	switch {
	case err != nil:
		return nil, budget.RunAccounts{}, false, fmt.Errorf("create run %s: %w", run.GetRunId(), err)
	case !created:
		stored, err = s.GetRun(ctx, run.GetTenantId(), existingID)
		return stored, budget.RunAccounts{}, false, err
	case stored == nil: // made by a try whose commit was ambiguous
		if stored, err = s.GetRun(ctx, run.GetTenantId(), run.GetRunId()); err == nil {
			accounts, err = readRunAccounts(ctx, s.q, s.pool, run.GetRunId())
		}
		return stored, accounts, err == nil, err
	}
	return stored, accounts, true, nil
}

// endReused stores, in tx, the tasks of the run just created (stored) that
// have ended already, as they are in stored.Tasks (a task that reuses
// another's facts: docs/budget.md#fork), replaces them in stored.Tasks by
// their rows, finished_at stamped, and returns their TaskFinished events.
// They began no attempt and hold no slice: nothing goes back to the run.
func endReused(ctx context.Context, tx pgx.Tx, stored *fanoutv1.Run, owner string) ([]*fanoutv1.RunEvent, error) {
	var ended []*fanoutv1.TaskOutcome
	for i, o := range stored.GetTasks() {
		st := o.GetStatus()
		if st == fanoutv1.TaskStatus_TASK_STATUS_PENDING || st == fanoutv1.TaskStatus_TASK_STATUS_UNSPECIFIED {
			continue
		}
		args, err := finishArgs(stored.GetRunId(), owner, o)
		if err != nil {
			return nil, err
		}
		rows, err := tx.Query(ctx, finishSQL, args...)
		if err != nil {
			return nil, fmt.Errorf("end reused task %s of run %s: %w", o.GetTaskId(), stored.GetRunId(), err)
		}
		row, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[taskRow])
		if err != nil {
			return nil, fmt.Errorf("end reused task %s of run %s: %w", o.GetTaskId(), stored.GetRunId(), err)
		}
		if stored.Tasks[i], err = row.outcome(); err != nil {
			return nil, err
		}
		ended = append(ended, stored.Tasks[i])
	}
	evs, _ := finishedEvents(ended)
	return evs, nil
}

// firstEvents are a new run's first events: RunStarted, with the run as
// stored and its account's budget, then queued.
func firstEvents(stored *fanoutv1.Run, accounts budget.RunAccounts, queued []*fanoutv1.RunEvent) []*fanoutv1.RunEvent {
	started := proto.CloneOf(stored)
	started.Budget = runs.Snapshot(accounts.Run)
	return append([]*fanoutv1.RunEvent{{Event: &fanoutv1.RunEvent_RunStarted{RunStarted: &fanoutv1.RunStarted{Run: started}}}},
		queued...)
}

// recordToolPolicy records, in tx, the tool policy of the run open opens.
func (s *Runs) recordToolPolicy(ctx context.Context, tx pgx.Tx, open budget.OpenRunParams, tools []runs.ToolPolicy) error {
	if len(tools) == 0 {
		return nil
	}
	names := make([]string, len(tools))
	approvals := make([]bool, len(tools))
	timeouts := make([]int64, len(tools))
	for i, t := range tools {
		if t.Tool == "" || (t.Approval && t.ApprovalTimeout <= 0) || (!t.Approval && t.ApprovalTimeout != 0) {
			return fmt.Errorf("record the tool policy of run %s: tools[%d] (%q): a tool needs a name, and an approval timeout > 0 "+
				"exactly when it needs approval", open.RunID, i, t.Tool)
		}
		names[i], approvals[i], timeouts[i] = t.Tool, t.Approval, t.ApprovalTimeout.Milliseconds()
	}
	// (sqlc does not know unnest of several arrays.)
	if _, err := tx.Exec(ctx, `INSERT INTO run_tool_policy (tenant_id, run_id, tool, approval, approval_timeout_ms)
		SELECT $1, $2, t.tool, t.approval, t.timeout_ms
		  FROM unnest($3::text[], $4::boolean[], $5::bigint[]) AS t(tool, approval, timeout_ms)
		ON CONFLICT (run_id, tool) DO NOTHING`, open.TenantID, open.RunID, names, approvals, timeouts); err != nil {
		return fmt.Errorf("record the tool policy of run %s: %w", open.RunID, err)
	}
	return nil
}

// beginAttemptsSQL begins the first attempt of each of a new run's task
// accounts ($1, ascending) in one statement.
const beginAttemptsSQL = `SELECT account_id, outcome, attempt, secret FROM ledger_begin_attempts($1, $2, $3)`

// beginAttempts begins, in tx, the first attempt of each of the tasks
// named in begin (of the run open opened as accounts), and returns them by
// task id. An account the ledger refuses (none of a run just opened is)
// gets none: its dispatch begins one, and hears why.
func beginAttempts(ctx context.Context, tx pgx.Tx, open budget.OpenRunParams, accounts budget.RunAccounts,
	begin []string) (map[string]budget.Attempt, error) {
	if len(begin) == 0 {
		return nil, nil
	}
	ids := make([]int64, 0, len(begin))
	task := make(map[int64]string, len(begin))
	for _, t := range begin {
		id, ok := accounts.Tasks[t]
		if !ok {
			return nil, fmt.Errorf("begin attempts of run %s: no task %q", open.RunID, t)
		}
		ids = append(ids, int64(id))
		task[int64(id)] = t
	}
	slices.Sort(ids) // the lock order of the ledger's batches
	rows, err := tx.Query(ctx, beginAttemptsSQL, ids, open.RunID, open.TenantID)
	if err != nil {
		return nil, fmt.Errorf("begin attempts of run %s: %w", open.RunID, err)
	}
	out := make(map[string]budget.Attempt, len(begin))
	var id, n int64
	var outcome string
	var secret *string
	_, err = pgx.ForEachRow(rows, []any{&id, &outcome, &n, &secret}, func() error {
		if outcome == "ok" && secret != nil {
			out[task[id]] = budget.Attempt{N: n, Secret: *secret}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("begin attempts of run %s: %w", open.RunID, err)
	}
	return out, nil
}

// runArgs are a new run's columns as CreateRun writes them.
type runArgs struct {
	spec, labels []byte
	taskIDs      []string
}

func newRunArgs(run *fanoutv1.Run) (runArgs, error) {
	spec, err := encodeSpec(run.GetSpec())
	if err != nil {
		return runArgs{}, fmt.Errorf("create run %s: encode spec: %w", run.GetRunId(), err)
	}
	labels, err := json.Marshal(nonNilMap(run.GetLabels()))
	if err != nil {
		return runArgs{}, fmt.Errorf("create run %s: encode labels: %w", run.GetRunId(), err)
	}
	taskIDs := make([]string, len(run.GetTasks()))
	for i, t := range run.GetTasks() {
		taskIDs[i] = t.GetTaskId()
	}
	return runArgs{spec: spec, labels: labels, taskIDs: taskIDs}, nil
}

// TenantQuotas returns the tenant's quotas (none for a tenant without a
// row yet).
func (s *Runs) TenantQuotas(ctx context.Context, tenantID string) (tenant.Quotas, error) {
	return retry(ctx, s.log, "runs.tenant_quotas", idempotent, func(ctx context.Context, _ try) (tenant.Quotas, error) {
		r, err := s.q.Tenant(ctx, s.pool, tenantID)
		if errors.Is(err, pgx.ErrNoRows) {
			return tenant.Quotas{}, nil
		}
		return tenantOf(r).Quotas, err
	})
}

// checkConcurrentRuns enforces the tenant's max_concurrent_runs on a run about to be
// created, in CreateRun's (or OpenRun's) transaction: it counts the tenant's RUNNING runs
// under a transaction-scoped advisory lock of the tenant, which every
// admission of that tenant takes, so two replicas admitting at once are
// counted one after the other and cannot both pass the cap. A retry of a
// run that exists (its idempotency key is taken) is never refused.
func (s *Runs) checkConcurrentRuns(ctx context.Context, tx pgx.Tx, run *fanoutv1.Run) error {
	t, err := s.q.Tenant(ctx, tx, run.GetTenantId())
	if errors.Is(err, pgx.ErrNoRows) || err == nil && t.MaxConcurrentRuns == nil {
		return nil
	}
	if err != nil {
		return err
	}
	limit := t.MaxConcurrentRuns
	if err := s.q.LockTenantRuns(ctx, tx, run.GetTenantId()); err != nil {
		return err
	}
	a, err := s.q.RunAdmission(ctx, tx, dbsqlc.RunAdmissionParams{TenantID: run.GetTenantId(), IdempotencyKey: run.GetIdempotencyKey()})
	if err != nil || a.Taken {
		return err
	}
	running := a.Running
	if running >= int64(*limit) {
		return &tenant.QuotaError{Tenant: run.GetTenantId(), Quota: "max_concurrent_runs", Limit: int64(*limit), Used: running}
	}
	return nil
}

// specGranted makes child run's stored spec say the budget its parent
// task granted, when that is less than it asked (budget.limit_tokens).
func (s *Runs) specGranted(ctx context.Context, tx pgx.Tx, run *fanoutv1.Run, granted int64) error {
	b := run.GetSpec().GetBudget()
	if b.GetLimitTokens() <= granted {
		return nil
	}
	b.LimitTokens = granted
	b.MinReservationTokens = min(b.GetMinReservationTokens(), granted)
	spec, err := encodeSpec(run.GetSpec())
	if err != nil {
		return fmt.Errorf("encode spec of child run %s: %w", run.GetRunId(), err)
	}
	if _, err := tx.Exec(ctx, `UPDATE run SET spec = $2 WHERE run_id = $1`, run.GetRunId(), spec); err != nil {
		return fmt.Errorf("record the budget child run %s was granted: %w", run.GetRunId(), err)
	}
	return nil
}

// checkTreeTasks enforces RunSpec.fan_out.max_tree_tasks on a child run
// about to be created under child.RootRunID, in OpenRun's transaction: it
// locks the root's row (every child's open of the tree takes it first)
// and counts the tasks of every run of the tree. A retry of a child that
// exists (its key is taken) is never refused.
func (s *Runs) checkTreeTasks(ctx context.Context, tx pgx.Tx, run *fanoutv1.Run, child *budget.ChildFunding) error {
	if err := s.q.LockTreeRoot(ctx, tx, child.RootRunID); err != nil {
		return fmt.Errorf("lock the root of the tree of run %s: %w", child.RootRunID, err)
	}
	used, err := s.q.TreeTasks(ctx, tx, child.RootRunID)
	if err != nil {
		return fmt.Errorf("count the tasks of the tree of run %s: %w", child.RootRunID, err)
	}
	if _, err := s.q.RunIDByKey(ctx, tx, dbsqlc.RunIDByKeyParams{TenantID: run.GetTenantId(), IdempotencyKey: run.GetIdempotencyKey()}); err == nil {
		return nil
	}
	if asked := len(run.GetTasks()); int(used)+asked > child.MaxTreeTasks {
		return &runs.TreeFullError{Root: child.RootRunID, Limit: child.MaxTreeTasks, Used: int(used), Asked: asked}
	}
	return nil
}

// createRun is CreateRun's transaction: it admits the run (checkConcurrentRuns), then
// inserts it and its tasks (created), or finds the key taken and returns
// the id of the run that has it.
func (s *Runs) createRun(ctx context.Context, tx pgx.Tx, run *fanoutv1.Run, a runArgs, owner string, child *budget.ChildFunding) (
	created bool, existingID string, createdAt time.Time, err error) {
	ins := dbsqlc.InsertRunParams{RunID: run.GetRunId(), TenantID: run.GetTenantId(),
		IdempotencyKey: run.GetIdempotencyKey(), Spec: a.spec, Labels: a.labels, Owner: owner, ForkedFrom: run.GetForkedFrom()}
	if child == nil {
		if err := s.checkConcurrentRuns(ctx, tx, run); err != nil {
			return false, "", createdAt, err
		}
	} else {
		// A child run is part of its root's run (max_concurrent_runs does
		// not count it), and its tasks count in its tree's.
		if err := s.checkTreeTasks(ctx, tx, run, child); err != nil {
			return false, "", createdAt, err
		}
		ins.ParentRunID, ins.ParentTaskID, ins.ParentCall = child.ParentRunID, child.ParentTaskID, child.Call
		ins.RootRunID, ins.Depth = child.RootRunID, child.Depth
	}
	createdAt, err = s.q.InsertRun(ctx, tx, ins)
	if errors.Is(err, pgx.ErrNoRows) {
		// The key is taken (perhaps by a transaction that just committed).
		existingID, err = s.q.RunIDByKey(ctx, tx, dbsqlc.RunIDByKeyParams{TenantID: run.GetTenantId(), IdempotencyKey: run.GetIdempotencyKey()})
		return false, existingID, createdAt, err
	}
	if err != nil {
		return false, "", createdAt, err
	}
	err = s.q.InsertTasks(ctx, tx, dbsqlc.InsertTasksParams{RunID: run.GetRunId(), TenantID: run.GetTenantId(), TaskIds: a.taskIDs})
	return err == nil, "", createdAt, err
}

func nonNilMap(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}
