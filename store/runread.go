package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store/internal/dbsqlc"
)

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
	ForkedFrom     string     `db:"forked_from"`
	ParentRunID    string     `db:"parent_run_id"`
	ParentTaskID   string     `db:"parent_task_id"`
	ParentCall     string     `db:"parent_call"`
	RootRunID      string     `db:"root_run_id"`
	Depth          int32      `db:"depth"`
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
		ForkedFrom:     r.ForkedFrom,
		ParentRunId:    r.ParentRunID,
		ParentTaskId:   r.ParentTaskID,
		RootRunId:      r.RootRunID,
		Depth:          r.Depth,
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
		run, err := r.run(tasks[r.RunID])
		if err != nil {
			return nil, err
		}
		// Its continuations (docs/budget.md#continue), counted apart: the
		// run's row does not change when one only tops it up.
		var at *time.Time
		err = s.pool.QueryRow(ctx, `SELECT count(*)::int, coalesce(sum(added_tokens), 0)::bigint,
			       (SELECT continued_at FROM run WHERE run_id = $1)
			  FROM run_continuation WHERE run_id = $1`, r.RunID).Scan(&run.Continuations, &run.AddedTokens, &at)
		if err != nil {
			return nil, fmt.Errorf("read the continuations of run %s: %w", r.RunID, err)
		}
		run.ContinuedAt = timestamp(at)
		return run, nil
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
