package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store/internal/dbsqlc"
	"github.com/fanout/fanout/tenant"
)

// Runs stores runs, their tasks and their event history (tables run, task
// and run_event). It implements orchestrator.RunStore. Every query names the
// tenant when the caller gives one; an empty tenant id matches any tenant
// (for the node that drives the run, which knows it owns it).
//
// Specs, outcomes, joined results and events are kept in jsonb columns as
// the store's own records (records.go), mapped from and to the API's
// messages here, so that SQL can read them; amounts stay typed columns.
//
// Unknown runs are reported as runs.ErrNotFound.
//
// Calls are retried after a transient database error (retry.go) where that
// cannot do their work twice: reads; updates that move a task or a run
// from a state they then leave, which settle an ambiguous commit by
// re-reading the row; and event appends, by the key of each event
// (run_event.event_key).
type Runs struct {
	db
	// events runs appendBatch, the one way events are written: inline (a
	// batch of one per call) or, with RunsConfig.Coalesce, group commit.
	events committer[*eventOp]
	// starts and finishes run startBatch and finishBatch: StartTask's and
	// FinishTask's calls, inline or, with Coalesce, the ones that arrive
	// together in one transaction.
	starts   committer[*startOp]
	finishes committer[*finishOp]
}

// NewRuns returns the run store on pool; each event write is its own
// transaction: NewRunsWithConfig with the zero RunsConfig.
func NewRuns(pool *pgxpool.Pool) *Runs { return NewRunsWithConfig(pool, RunsConfig{}) }

// RunsConfig tunes a Runs.
type RunsConfig struct {
	// Coalesce appends events that arrive together in one transaction (group
	// commit), and ends the tasks that end together (FinishTask) in one: a
	// run's events all take its row lock for their sequence, so a wide
	// fan-out otherwise queues thousands of transactions on one row.
	// A Runs with Coalesce must be closed with Close.
	Coalesce bool
	// Logger receives a warning for every retried database error. Default
	// slog.Default().
	Logger *slog.Logger
}

// NewRunsWithConfig returns the run store on pool tuned by cfg.
func NewRunsWithConfig(pool *pgxpool.Pool, cfg RunsConfig) *Runs {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Runs{db: newDB(pool, cfg.Logger)}
	s.events = inlineCommit[*eventOp]{run: s.appendBatch}
	s.starts = inlineCommit[*startOp]{run: s.startBatch}
	s.finishes = inlineCommit[*finishOp]{run: s.finishBatch}
	if cfg.Coalesce {
		s.events = newGroupCommit(2, 256, s.appendBatch)
		s.starts = newGroupCommit(2, 256, s.startBatch)
		s.finishes = newGroupCommit(2, 256, s.finishBatch)
	}
	return s
}

// Close stops the event and task committers; a no-op without Coalesce.
func (s *Runs) Close() {
	s.events.close()
	s.starts.close()
	s.finishes.close()
}

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
			created, existingID, _, err = s.createRun(ctx, tx, run, a, owner)
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
// Ledger.OpenRun does) and appends the events first returns, given the run
// as stored and its accounts, as the run's first events. A run is never
// stored without its accounts and its first events, and the three cost one
// commit. It also begins the first attempt of each task named in begin
// (accounts.Attempts), so that the run's first dispatches cost no write of
// their own. A run the tenant already has under run's idempotency key is
// returned as CreateRun returns it (created false, no accounts); a refusal
// of the ledger writes nothing (budget.ErrNotFound for an unknown tenant
// account, a budget.ValidationError for one that cannot hold the run).
// tools is the run's tool policy, recorded in the same transaction
// (run_tool_policy), where no worker's login can change it.
func (s *Runs) OpenRun(ctx context.Context, run *fanoutv1.Run, owner string, open budget.OpenRunParams,
	tools []runs.ToolPolicy, begin []string,
	first func(stored *fanoutv1.Run, accounts budget.RunAccounts) []*fanoutv1.RunEvent) (
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
			created, existingID, createdAt, err = s.createRun(ctx, tx, run, a, owner)
			if err != nil || !created {
				return err
			}
			if accounts, err = openRunIn(ctx, s.q, tx, open); err != nil {
				return openRunError(open, err)
			}
			if accounts.Attempts, err = beginAttempts(ctx, tx, open, accounts, begin); err != nil {
				return err
			}
			if err := s.recordToolPolicy(ctx, tx, open, tools); err != nil {
				return err
			}
			stored = proto.CloneOf(run)
			stored.CreatedAt = timestamppb.New(createdAt)
			return appendInTx(ctx, tx, run.GetRunId(), "first events", first(proto.CloneOf(stored), accounts))
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

// admitRun enforces the tenant's max_concurrent_runs on a run about to be
// created, in CreateRun's (or OpenRun's) transaction: it counts the tenant's RUNNING runs
// under a transaction-scoped advisory lock of the tenant, which every
// admission of that tenant takes, so two replicas admitting at once are
// counted one after the other and cannot both pass the cap. A retry of a
// run that exists (its idempotency key is taken) is never refused.
func (s *Runs) admitRun(ctx context.Context, tx pgx.Tx, run *fanoutv1.Run) error {
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

// createRun is CreateRun's transaction: it admits the run (admitRun), then
// inserts it and its tasks (created), or finds the key taken and returns
// the id of the run that has it.
func (s *Runs) createRun(ctx context.Context, tx pgx.Tx, run *fanoutv1.Run, a runArgs, owner string) (
	created bool, existingID string, createdAt time.Time, err error) {
	if err := s.admitRun(ctx, tx, run); err != nil {
		return false, "", createdAt, err
	}
	createdAt, err = s.q.InsertRun(ctx, tx, dbsqlc.InsertRunParams{RunID: run.GetRunId(), TenantID: run.GetTenantId(),
		IdempotencyKey: run.GetIdempotencyKey(), Spec: a.spec, Labels: a.labels, Owner: owner})
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

type runRow struct {
	RunID          string     `db:"run_id"`
	TenantID       string     `db:"tenant_id"`
	IdempotencyKey string     `db:"idempotency_key"`
	Spec           []byte     `db:"spec"`
	State          string     `db:"state"`
	CancelCause    string     `db:"cancel_cause"`
	Result         []byte     `db:"result"`
	Labels         []byte     `db:"labels"`
	CreatedAt      time.Time  `db:"created_at"`
	FinishedAt     *time.Time `db:"finished_at"`
}

// taskRow is a task as the store reads it: from the named queries Tasks and
// TaskSummaries, and by column name from what the hand-written task writes
// return.
type taskRow struct {
	RunID         string     `db:"run_id"`
	TaskID        string     `db:"task_id"`
	DispatchIndex int32      `db:"dispatch_index"`
	Status        string     `db:"status"`
	Outcome       []byte     `db:"outcome"`
	TokensSpent   int64      `db:"tokens_spent"`
	Worker        string     `db:"worker"`
	StartedAt     *time.Time `db:"started_at"`
	FinishedAt    *time.Time `db:"finished_at"`
}

func (r taskRow) outcome() (*fanoutv1.TaskOutcome, error) {
	o := &fanoutv1.TaskOutcome{}
	if r.Outcome != nil {
		var err error
		if o, err = decodeOutcome(r.Outcome); err != nil {
			return nil, fmt.Errorf("decode outcome of task %s: %w", r.TaskID, err)
		}
	}
	o.TaskId = r.TaskID
	o.DispatchIndex = r.DispatchIndex
	st, err := runs.ParseStatus(r.Status)
	if err != nil {
		return nil, fmt.Errorf("task %s of run %s: stored status: %w", r.TaskID, r.RunID, err)
	}
	o.Status = st
	o.TokensSpent = r.TokensSpent
	o.Worker = r.Worker
	o.StartedAt = timestamp(r.StartedAt)
	o.FinishedAt = timestamp(r.FinishedAt)
	return o, nil
}

func timestamp(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return timestamppb.New(*t)
}

func (r runRow) run(tasks []taskRow) (*fanoutv1.Run, error) {
	state, err := runs.ParseState(r.State)
	if err != nil {
		return nil, fmt.Errorf("run %s: stored state: %w", r.RunID, err)
	}
	out := &fanoutv1.Run{
		RunId:          r.RunID,
		TenantId:       r.TenantID,
		IdempotencyKey: r.IdempotencyKey,
		State:          state,
		CancelCause:    r.CancelCause,
		CreatedAt:      timestamppb.New(r.CreatedAt),
		FinishedAt:     timestamp(r.FinishedAt),
	}
	if out.Spec, err = decodeSpec(r.Spec); err != nil {
		return nil, fmt.Errorf("decode spec of run %s: %w", r.RunID, err)
	}
	if r.Result != nil {
		if out.Result, err = decodeResult(r.Result); err != nil {
			return nil, fmt.Errorf("decode result of run %s: %w", r.RunID, err)
		}
	}
	if err := json.Unmarshal(r.Labels, &out.Labels); err != nil {
		return nil, fmt.Errorf("decode labels of run %s: %w", r.RunID, err)
	}
	if len(out.Labels) == 0 {
		out.Labels = nil
	}
	for _, t := range tasks {
		o, err := t.outcome()
		if err != nil {
			return nil, err
		}
		out.Tasks = append(out.Tasks, o)
	}
	return out, nil
}

// GetRun returns a run of tenantID with every task's outcome in dispatch
// order. Returns runs.ErrNotFound if the tenant has no such run, and
// runs.ErrNoTenant for an empty tenantID: every read on behalf of a caller
// is scoped to the caller's tenant.
func (s *Runs) GetRun(ctx context.Context, tenantID, runID string) (*fanoutv1.Run, error) {
	if tenantID == "" {
		return nil, fmt.Errorf("get run %s: %w", runID, runs.ErrNoTenant)
	}
	return s.getRun(ctx, tenantID, runID)
}

// RunByKey returns tenantID's run created under idempotency key key, or
// runs.ErrNotFound: for an idempotent retry that admission would refuse.
func (s *Runs) RunByKey(ctx context.Context, tenantID, key string) (*fanoutv1.Run, error) {
	found, err := s.readRun(ctx, func(ctx context.Context) (runRow, error) {
		r, err := s.q.RunByKey(ctx, s.pool, dbsqlc.RunByKeyParams{TenantID: tenantID, IdempotencyKey: key})
		return runRow(r), err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("run of tenant %s with that idempotency key: %w", tenantID, runs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("find run of tenant %s by its idempotency key: %w", tenantID, err)
	}
	return found, nil
}

// ReadRun returns a run of any tenant: for the engine's own paths (adopting
// a run, ending a run it drives), which know a run only by its id. Never
// for a caller's request (GetRun is).
func (s *Runs) ReadRun(ctx context.Context, runID string) (*fanoutv1.Run, error) {
	return s.getRun(ctx, "", runID)
}

func (s *Runs) getRun(ctx context.Context, tenantID, runID string) (*fanoutv1.Run, error) {
	found, err := s.readRun(ctx, func(ctx context.Context) (runRow, error) {
		r, err := s.q.RunByID(ctx, s.pool, dbsqlc.RunByIDParams{RunID: runID, TenantID: tenantID})
		return runRow(r), err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("run %s: %w", runID, runs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get run %s: %w", runID, err)
	}
	return found, nil
}

// ListRuns returns summaries of up to limit runs of tenantID, newest first,
// in state (any state if RUN_STATE_UNSPECIFIED), that are older than the
// run (beforeCreated, beforeID) in that order; a zero beforeCreated starts
// with the newest. A summary has no spec, no result and no task summaries
// (GetRun has them): the query does not read those jsonb columns, so a page
// costs memory by its runs' tasks, not by their specs. Its budget is the run
// account's, read in the same query.
func (s *Runs) ListRuns(ctx context.Context, tenantID string, state fanoutv1.RunState,
	beforeCreated time.Time, beforeID string, limit int) ([]*fanoutv1.Run, error) {
	stateName := ""
	if state != fanoutv1.RunState_RUN_STATE_UNSPECIFIED {
		stateName = runs.Text(state)
	}
	var before *time.Time
	if !beforeCreated.IsZero() {
		before = &beforeCreated
	}
	found, err := retry(ctx, s.log, "runs.read_summaries", idempotent, func(ctx context.Context, _ try) ([]*fanoutv1.Run, error) {
		return s.readSummaries(ctx, dbsqlc.RunSummariesParams{TenantID: tenantID, State: stateName,
			BeforeCreated: before, BeforeID: beforeID, MaxRuns: int32(min(limit, math.MaxInt32))})
	})
	if err != nil {
		return nil, fmt.Errorf("list runs of tenant %s: %w", tenantID, err)
	}
	return found, nil
}

// readSummaries reads a page of run summaries and, in a second query, their
// tasks without outcomes.
func (s *Runs) readSummaries(ctx context.Context, p dbsqlc.RunSummariesParams) ([]*fanoutv1.Run, error) {
	sums, err := s.q.RunSummaries(ctx, s.pool, p)
	if err != nil || len(sums) == 0 {
		return nil, err
	}
	ids := make([]string, len(sums))
	for i, r := range sums {
		ids[i] = r.RunID
	}
	tasks, err := s.tasksOf(ctx, ids, false)
	if err != nil {
		return nil, err
	}
	out := make([]*fanoutv1.Run, len(sums))
	for i, r := range sums {
		st, err := runs.ParseState(r.State)
		if err != nil {
			return nil, fmt.Errorf("run %s: stored state: %w", r.RunID, err)
		}
		run := &fanoutv1.Run{RunId: r.RunID, TenantId: r.TenantID, IdempotencyKey: r.IdempotencyKey,
			State: st, CancelCause: r.CancelCause,
			CreatedAt: timestamppb.New(r.CreatedAt), FinishedAt: timestamp(r.FinishedAt)}
		if err := json.Unmarshal(r.Labels, &run.Labels); err != nil {
			return nil, fmt.Errorf("decode labels of run %s: %w", r.RunID, err)
		}
		if len(run.Labels) == 0 {
			run.Labels = nil
		}
		for _, t := range tasks[r.RunID] {
			o, err := t.outcome()
			if err != nil {
				return nil, err
			}
			run.Tasks = append(run.Tasks, o)
		}
		if r.LimitTokens != nil {
			run.Budget = &fanoutv1.BudgetSnapshot{LimitTokens: *r.LimitTokens,
				AvailableTokens: *r.LimitTokens - r.Reserved - r.Spent, ReservedTokens: r.Reserved,
				SpentTokens: r.Spent, Exhausted: r.Exhausted}
		}
		out[i] = run
	}
	return out, nil
}

// readRun reads one run with read (pgx.ErrNoRows: none) and, in a second
// query, its tasks, under retry.
func (s *Runs) readRun(ctx context.Context, read func(context.Context) (runRow, error)) (*fanoutv1.Run, error) {
	return retry(ctx, s.log, "runs.read_runs", idempotent, func(ctx context.Context, _ try) (*fanoutv1.Run, error) {
		r, err := read(ctx)
		if err != nil {
			return nil, err
		}
		tasks, err := s.tasksOf(ctx, []string{r.RunID}, true)
		if err != nil {
			return nil, err
		}
		return r.run(tasks[r.RunID])
	})
}

// tasksOf reads the tasks of runIDs, with their outcomes or without, in one
// query, by run, in dispatch order.
func (s *Runs) tasksOf(ctx context.Context, runIDs []string, outcomes bool) (map[string][]taskRow, error) {
	var taskRows []taskRow
	if outcomes {
		rows, err := s.q.Tasks(ctx, s.pool, runIDs)
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			taskRows = append(taskRows, taskRow(r))
		}
	} else {
		rows, err := s.q.TaskSummaries(ctx, s.pool, runIDs)
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			taskRows = append(taskRows, taskRow{RunID: r.RunID, TaskID: r.TaskID, DispatchIndex: r.DispatchIndex,
				Status: r.Status, TokensSpent: r.TokensSpent, Worker: r.Worker, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt})
		}
	}
	byRun := make(map[string][]taskRow, len(runIDs))
	for _, t := range taskRows {
		byRun[t.RunID] = append(byRun[t.RunID], t)
	}
	return byRun, nil
}

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
	evs := make([]*fanoutv1.RunEvent, len(ops))
	keys := make([]string, len(ops))
	for i, op := range ops {
		evs[i] = &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskStarted{TaskStarted: op.started}}
		keys[i] = op.key
	}
	return appendKeyed(ctx, tx, runID, "TaskStarted", evs, keys)
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
		for i := 0; i < len(batch); {
			j := i
			var started []*startOp
			for ; j < len(batch) && batch[j].item.runID == batch[i].item.runID; j++ {
				if op := batch[j].item; op.out != nil && !op.stored {
					started = append(started, op)
				}
			}
			if len(started) > 0 {
				if err := appendStarted(ctx, tx, batch[i].item.runID, started); err != nil {
					return err
				}
			}
			i = j
		}
		return nil
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
		for i := 0; i < len(queued); {
			j := i
			var outs []*fanoutv1.TaskOutcome
			for ; j < len(queued) && queued[j].runID == queued[i].runID; j++ {
				if queued[j].out != nil {
					outs = append(outs, queued[j].out)
				}
			}
			if err := appendFinished(ctx, tx, queued[i].runID, outs); err != nil {
				return err
			}
			i = j
		}
		return nil
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
// order, within tx (appendSQL, as AppendEvents does).
func appendFinished(ctx context.Context, tx pgx.Tx, runID string, outcomes []*fanoutv1.TaskOutcome) error {
	evs := make([]*fanoutv1.RunEvent, len(outcomes))
	for i, o := range outcomes {
		evs[i] = &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskFinished{TaskFinished: &fanoutv1.TaskFinished{Outcome: o}}}
	}
	return appendInTx(ctx, tx, runID, "TaskFinished", evs)
}

// appendInTx appends evs (of one kind, named what) to the run, in order,
// within tx (appendSQL). A run that has ended takes none: runs.ErrEnded.
func appendInTx(ctx context.Context, tx pgx.Tx, runID, what string, evs []*fanoutv1.RunEvent) error {
	keys := make([]string, len(evs))
	for i := range keys {
		keys[i] = newEventKey()
	}
	return appendKeyed(ctx, tx, runID, what, evs, keys)
}

// appendKeyed is appendInTx with each event's key given.
func appendKeyed(ctx context.Context, tx pgx.Tx, runID, what string, evs []*fanoutv1.RunEvent, keys []string) error {
	if len(evs) == 0 {
		return nil
	}
	bodies := make([][]byte, len(evs))
	for i, ev := range evs {
		body, err := encodeEvent(ev)
		if err != nil {
			return fmt.Errorf("append %s to run %s: encode: %w", what, runID, err)
		}
		bodies[i] = body
	}
	var state string
	var last int64
	var at time.Time
	if err := tx.QueryRow(ctx, appendSQL, runID, bodies, keys).Scan(&state, &last, &at); err != nil {
		return fmt.Errorf("append %s to run %s: %w", what, runID, err)
	}
	if state != "RUNNING" {
		return fmt.Errorf("append %s to run %s: the run has ended %s: %w", what, runID, state, runs.ErrEnded)
	}
	return nil
}

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

// FinishRun ends the run with a terminal state, cause and joined result,
// stamping finished_at (database time), if it is RUNNING and owner drives it
// (run.owner), and returns the run with ended true. Otherwise (the run has
// already ended, or another replica adopted it) it writes nothing and
// returns the run as stored with ended false: so exactly one caller ends a
// run and reports it. Returns runs.ErrNotFound for an unknown run.
func (s *Runs) FinishRun(ctx context.Context, runID, owner string, state fanoutv1.RunState, cause string,
	result *fanoutv1.JoinedResult) (run *fanoutv1.Run, ended bool, err error) {
	// Only the owner ends a run, and once: a try after an ambiguous commit
	// that finds the run ended as this call would end it, still owned by
	// owner, was that try (finishRun).
	err = retried(ctx, s.log, "runs.finish_run", idempotent, func(ctx context.Context, t try) error {
		ended, err = s.finishRun(ctx, s.pool, runID, owner, state, cause, result, t)
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
// spend and appends the events closed returns, given that account, before
// the RunFinished: the run's close, its last budget view and its end cost
// one commit, and the end is never durable before the ledger's close. It
// returns the run's row (its state, cause and times, without its tasks)
// and the closed account, or nil for a run without ledger accounts (then
// closed is not called). If the run changed hands since epoch (its
// owner epoch) it writes nothing and returns a budget.DeniedError.
func (s *Runs) CloseRun(ctx context.Context, runID, owner string, epoch int64, state fanoutv1.RunState, cause string,
	result *fanoutv1.JoinedResult, closed func(budget.Account) []*fanoutv1.RunEvent) (
	run *fanoutv1.Run, acct *budget.Account, ended bool, err error) {
	// As FinishRun; closing a closed run again changes nothing, and a try
	// after a lost reply that committed finds the run ended (no event is
	// appended to an ended run).
	err = retried(ctx, s.log, "runs.close_run", idempotent, func(ctx context.Context, t try) error {
		acct = nil
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
				acct = &a
				if result != nil {
					result.TotalTokens = a.Spent
				}
				if err := appendInTx(ctx, tx, runID, "closing events", closed(a)); err != nil && !errors.Is(err, runs.ErrEnded) {
					return err
				}
				// No decision reaches a write of an ended run: those
				// still waiting are denied, "run ended".
				if _, err := s.q.EndRunToolCalls(ctx, tx, runID); err != nil {
					return fmt.Errorf("deny the run's pending tool writes: %w", err)
				}
			}
			ended, err = s.finishRun(ctx, tx, runID, owner, state, cause, result, t)
			return err
		})
	})
	if err != nil {
		return nil, nil, false, fmt.Errorf("close run %s: %w", runID, err)
	}
	// Its row, not its tasks: reading back a wide run's outcomes would
	// delay its end for nothing.
	r, err := retry(ctx, s.log, "runs.run_end", idempotent, func(ctx context.Context, _ try) (dbsqlc.RunEndRow, error) {
		return s.q.RunEnd(ctx, s.pool, runID)
	})
	if err != nil {
		return nil, acct, false, fmt.Errorf("close run %s: read its end: %w", runID, err)
	}
	st, err := runs.ParseState(r.State)
	if err != nil {
		return nil, acct, false, fmt.Errorf("close run %s: stored state: %w", runID, err)
	}
	return &fanoutv1.Run{RunId: runID, State: st, CancelCause: r.CancelCause, CreatedAt: timestamppb.New(r.CreatedAt),
		FinishedAt: timestamp(r.FinishedAt)}, acct, ended, nil
}

// finishRun is one try of FinishRun's write, with db (the pool, or
// CloseRun's transaction): it reports whether this call ended the run.
func (s *Runs) finishRun(ctx context.Context, db dbsqlc.DBTX, runID, owner string, state fanoutv1.RunState, cause string,
	result *fanoutv1.JoinedResult, t try) (ended bool, err error) {
	body, err := encodeResult(result)
	if err != nil {
		return false, fmt.Errorf("finish run %s: encode result: %w", runID, err)
	}
	if result == nil {
		body = nil
	}
	event, err := encodeEvent(&fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_RunFinished{
		RunFinished: &fanoutv1.RunFinished{State: state, CancelCause: cause, Result: result}}})
	if err != nil {
		return false, fmt.Errorf("finish run %s: encode RunFinished: %w", runID, err)
	}
	// One statement: the final state, the result and the RunFinished event
	// commit together, so that no follower sees an ended run without its end.
	tag, err := db.Exec(ctx, `WITH fin AS (
			UPDATE run
			SET state = $3, cancel_cause = $4, result = $5, finished_at = now(), last_sequence = last_sequence + 1
			WHERE run_id = $1 AND owner = $2 AND state = 'RUNNING'
			RETURNING tenant_id, last_sequence)
		INSERT INTO run_event (run_id, sequence, tenant_id, event)
		SELECT $1, fin.last_sequence, fin.tenant_id, $6 FROM fin`,
		runID, owner, runs.Text(state), cause, body, event)
	if err != nil {
		return false, fmt.Errorf("finish run %s: %w", runID, err)
	}
	ended = tag.RowsAffected() == 1
	if !ended && t.ambiguous {
		err = db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM run
			WHERE run_id = $1 AND owner = $2 AND state = $3 AND cancel_cause = $4)`,
			runID, owner, runs.Text(state), cause).Scan(&ended)
		if err != nil {
			return false, fmt.Errorf("finish run %s: re-read after a lost reply: %w", runID, err)
		}
	}
	return ended, nil
}

// Heads returns, for each of runIDs that exists, its newest event's
// sequence and its state, in one statement: what a node's watch poller
// needs to know whether any follower of those runs has something to read.
func (s *Runs) Heads(ctx context.Context, runIDs []string) (map[string]runs.Head, error) {
	if len(runIDs) == 0 {
		return nil, nil
	}
	heads, err := retry(ctx, s.log, "runs.heads", idempotent, func(ctx context.Context, _ try) (map[string]runs.Head, error) {
		rows, err := s.q.Heads(ctx, s.pool, runIDs)
		if err != nil {
			return nil, err
		}
		heads := make(map[string]runs.Head, len(rows))
		for _, r := range rows {
			st, err := runs.ParseState(r.State)
			if err != nil {
				return nil, fmt.Errorf("run %s: stored state: %w", r.RunID, err)
			}
			heads[r.RunID] = runs.Head{Sequence: r.LastSequence, State: st}
		}
		return heads, nil
	})
	if err != nil {
		return nil, fmt.Errorf("read run heads: %w", err)
	}
	return heads, nil
}

// Heartbeat refreshes, to database time, the lease (owner_heartbeat) of
// every run in runIDs that is RUNNING and owned by owner, in one statement.
// It returns the runs of runIDs that another node owns now: adopted while
// owner's heartbeat lapsed; owner must stop writing for them. Runs that
// ended or do not exist are neither refreshed nor returned.
func (s *Runs) Heartbeat(ctx context.Context, owner string, runIDs []string) (lost []string, err error) {
	if len(runIDs) == 0 {
		return nil, nil
	}
	// Idempotent: a second refresh of the same leases changes nothing more.
	lost, err = retry(ctx, s.log, "runs.heartbeat", idempotent, func(ctx context.Context, _ try) ([]string, error) {
		return s.q.Heartbeat(ctx, s.pool, dbsqlc.HeartbeatParams{RunIds: runIDs, Owner: owner})
	})
	if err != nil {
		return nil, fmt.Errorf("heartbeat %d runs of %s: %w", len(runIDs), owner, err)
	}
	return lost, nil
}

// AdoptOrphan makes node the owner of one RUNNING run whose heartbeat is
// older than orphanAfter (database time), the stalest first, refreshing its
// heartbeat and counting the adoption (unless node owned it already: its
// own lease lapsed), and returns it (RunID empty when no run is orphaned). The row is locked and its staleness re-checked by the
// UPDATE itself, so of several replicas adopting at once exactly one gets
// each run (the others skip it or find it fresh).
func (s *Runs) AdoptOrphan(ctx context.Context, node string, orphanAfter time.Duration) (runs.Adoption, error) {
	// Retried only when surely not done: an adoption that committed unheard
	// leaves the run to this node's next sweep once its lease lapses again.
	r, err := retry(ctx, s.log, "runs.adopt_orphan", unsentOnly, func(ctx context.Context, _ try) (dbsqlc.AdoptOrphanRow, error) {
		return s.q.AdoptOrphan(ctx, s.pool, dbsqlc.AdoptOrphanParams{Node: node, OrphanAfter: orphanAfter})
	})
	a := runs.Adoption{RunID: r.RunID, PrevOwner: r.PrevOwner, Adoptions: int(r.Adoptions), At: r.AdoptedAt}
	if errors.Is(err, pgx.ErrNoRows) {
		return runs.Adoption{}, nil
	}
	if err != nil {
		return runs.Adoption{}, fmt.Errorf("adopt an orphaned run for %s: %w", node, err)
	}
	return a, nil
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

// AppendEvent appends ev as the run's next event and returns a copy with its
// sequence (the previous one plus 1: no gaps, even with concurrent writers)
// and time (database time) set. A run's history ends with its RunFinished:
// once the run has ended, any other event is refused with runs.ErrEnded
// (it comes from a replica that lost the run to another). Returns
// runs.ErrNotFound for an unknown run.
func (s *Runs) AppendEvent(ctx context.Context, runID string, ev *fanoutv1.RunEvent) (*fanoutv1.RunEvent, error) {
	out, err := s.AppendEvents(ctx, runID, []*fanoutv1.RunEvent{ev})
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// AppendEvents appends evs to the run as consecutive events, in order and
// all or none, and returns copies with their sequences and time set. Its
// error contract is AppendEvent's: once the run has ended it takes nothing
// (runs.ErrEnded; the end wrote the RunFinished, FinishRun); an unknown run
// is runs.ErrNotFound.
func (s *Runs) AppendEvents(ctx context.Context, runID string, evs []*fanoutv1.RunEvent) ([]*fanoutv1.RunEvent, error) {
	if len(evs) == 0 {
		return nil, nil
	}
	op := &eventOp{runID: runID, bodies: make([][]byte, len(evs)), keys: make([]string, len(evs))}
	outs := make([]*fanoutv1.RunEvent, len(evs))
	for i, ev := range evs {
		out := proto.CloneOf(ev)
		out.RunId, out.Sequence, out.Time = "", 0, nil // the columns hold them
		body, err := encodeEvent(out)
		if err != nil {
			return nil, fmt.Errorf("append events to run %s: encode: %w", runID, err)
		}
		outs[i], op.bodies[i], op.keys[i] = out, body, newEventKey()
	}
	// Idempotent by the events' keys: a try after an ambiguous commit first
	// looks for them, and a try that collides with them (the lost try
	// committed meanwhile) finds them too.
	err := retried(ctx, s.log, "runs.append_events", idempotent, func(ctx context.Context, t try) error {
		if t.ambiguous {
			if found, err := s.appended(ctx, op); found || err != nil {
				return err
			}
		}
		op.err = nil
		if _, err := s.events.do(ctx, op); err != nil {
			return err
		}
		if isUniqueViolation(op.err) {
			if found, err := s.appended(ctx, op); found || err != nil {
				return err
			}
		}
		return op.err
	})
	if err != nil {
		return nil, fmt.Errorf("append events to run %s: %w", runID, err)
	}
	for i, out := range outs {
		out.RunId, out.Sequence, out.Time = runID, op.first+int64(i), timestamppb.New(op.at)
	}
	return outs, nil
}

// appended reports whether op's events are stored (found by the key of
// the first: a call's events are written all or none) and if so sets op's
// first sequence and time from them.
func (s *Runs) appended(ctx context.Context, op *eventOp) (bool, error) {
	r, err := s.q.EventByKey(ctx, s.pool, dbsqlc.EventByKeyParams{RunID: op.runID, EventKey: op.keys[0]})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	op.first, op.at = r.Sequence, r.CreatedAt
	return err == nil, err
}

// newEventKey is a random (version 4) UUID, the key of one event.
func newEventKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// eventOp is one AppendEvents call waiting for its batch.
type eventOp struct {
	runID  string
	bodies [][]byte // eventRecords, in order
	keys   []string // each body's event_key
	first  int64    // the sequence of bodies[0], once appended
	at     time.Time
	err    error
}

// appendSQL appends one run's events of a batch in one statement: one
// UPDATE of the run row takes as many sequence numbers as it accepts events
// (all while the run is RUNNING, none once it ended: FinishRun wrote the
// run's last event, its RunFinished) and
// one INSERT stores them with their keys ($3), numbered in array order. The
// row lock makes the sequences gapless; no row back means no such run.
const appendSQL = `
	WITH seq AS (
		UPDATE run SET last_sequence = last_sequence + CASE WHEN state = 'RUNNING' THEN cardinality($2::jsonb[]) ELSE 0 END
		WHERE run_id = $1
		RETURNING tenant_id, last_sequence, state),
	kept AS (
		SELECT t.body, t.key, row_number() OVER (ORDER BY t.ord) AS k, count(*) OVER () AS n
		  FROM seq, unnest($2::jsonb[], $3::uuid[]) WITH ORDINALITY AS t(body, key, ord)
		 WHERE seq.state = 'RUNNING'),
	ins AS (
		INSERT INTO run_event (run_id, sequence, tenant_id, event, event_key)
		SELECT $1, seq.last_sequence - kept.n + kept.k, seq.tenant_id, kept.body, kept.key FROM seq, kept)
	SELECT state, last_sequence, now() FROM seq`

// appendBatch appends a batch of AppendEvents calls in one round trip and
// one transaction: one appendSQL per run, runs in id order (so concurrent
// batches lock run rows in one order and cannot deadlock), each run's calls
// in arrival order. If the transaction fails as a whole because of one call
// (a server error rolled it back), each call is tried again on its own, so
// that one bad call fails alone; a transient error (retry.go) fails every
// call instead, for AppendEvents to retry under its caller's deadline.
func (s *Runs) appendBatch(ctx context.Context, batch []*pending[*eventOp]) {
	defer func() {
		for _, p := range batch {
			close(p.done)
		}
	}()
	slices.SortStableFunc(batch, func(a, b *pending[*eventOp]) int { return strings.Compare(a.item.runID, b.item.runID) })
	var groups [][]*eventOp
	for i, p := range batch {
		if i == 0 || p.item.runID != batch[i-1].item.runID {
			groups = append(groups, nil)
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], p.item)
	}
	err := s.appendGroups(ctx, groups)
	if err == nil {
		return
	}
	if class, _ := classify(err); class != permanent || len(batch) == 1 {
		for _, p := range batch {
			p.item.err = err
		}
		return
	}
	for _, p := range batch {
		if err := s.appendGroups(ctx, [][]*eventOp{{p.item}}); err != nil {
			p.item.err = err
		}
	}
}

// appendGroups runs appendSQL for each group (one run's calls) in one
// pgx batch, which PostgreSQL runs as one implicit transaction. It sets
// each call's outcome and returns an error only if the batch failed.
func (s *Runs) appendGroups(ctx context.Context, groups [][]*eventOp) error {
	q := &pgx.Batch{}
	for _, g := range groups {
		var bodies [][]byte
		var keys []string
		for _, op := range g {
			bodies = append(bodies, op.bodies...)
			keys = append(keys, op.keys...)
		}
		q.Queue(appendSQL, g[0].runID, bodies, keys)
	}
	br := s.pool.SendBatch(ctx, q)
	for _, g := range groups {
		var state string
		var last int64
		var at time.Time
		err := br.QueryRow().Scan(&state, &last, &at)
		if errors.Is(err, pgx.ErrNoRows) {
			for _, op := range g {
				op.err = runs.ErrNotFound
			}
			continue
		}
		if err != nil {
			_ = br.Close()
			return err
		}
		// Number the calls as appendSQL numbered their events.
		next := last + 1
		for _, op := range g {
			if state != "RUNNING" {
				op.err = fmt.Errorf("the run has ended %s: %w", state, runs.ErrEnded)
				continue
			}
			next -= int64(len(op.bodies))
		}
		for _, op := range g {
			if state == "RUNNING" {
				op.first, op.at, op.err = next, at, nil
				next += int64(len(op.bodies))
			}
		}
	}
	return br.Close()
}

// Events returns up to limit events of the run with sequence > after, in
// sequence order. An unknown run (or one of another tenant) has no events;
// an empty tenantID is runs.ErrNoTenant.
func (s *Runs) Events(ctx context.Context, tenantID, runID string, after int64, limit int) ([]*fanoutv1.RunEvent, error) {
	if tenantID == "" {
		return nil, fmt.Errorf("events of run %s: %w", runID, runs.ErrNoTenant)
	}
	out, err := retry(ctx, s.log, "runs.events", idempotent, func(ctx context.Context, _ try) ([]*fanoutv1.RunEvent, error) {
		rows, err := s.q.Events(ctx, s.pool, dbsqlc.EventsParams{RunID: runID, TenantID: tenantID, After: after,
			MaxEvents: int32(min(limit, math.MaxInt32))})
		if err != nil {
			return nil, err
		}
		out := make([]*fanoutv1.RunEvent, len(rows))
		for i, r := range rows {
			ev, err := decodeEvent(r.Event)
			if err != nil {
				return nil, fmt.Errorf("decode event %d: %w", r.Sequence, err)
			}
			ev.RunId, ev.Sequence, ev.Time = runID, r.Sequence, timestamppb.New(r.CreatedAt)
			out[i] = ev
		}
		return out, nil
	})
	if err != nil {
		return nil, fmt.Errorf("read events of run %s: %w", runID, err)
	}
	return out, nil
}
