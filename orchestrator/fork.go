package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"google.golang.org/protobuf/proto"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// Forked is what Engine.Fork did: the new run (nil for a dry run), the
// source tasks it reuses, and the quote (a dry run's).
type Forked struct {
	Run    *fanoutv1.Run
	Reused []string
	Quote  *fanoutv1.Quote
}

// Fork starts a new run of tenantID from its recorded run req.run_id with
// req's changes (docs/budget.md#fork): the tasks whose content is unchanged
// and that SUCCEEDED in the source reuse its facts without running; the
// others run. A retry with the same idempotency key returns the run the
// first call created. With req.dry_run nothing is written and the quote
// says what would run. With req.reserve_quote the fork starts only if its
// tenant covers its quote, as StartRun's (the quote counts every task as
// running: a reused task's 0 is not subtracted).
func (e *Engine) Fork(ctx context.Context, tenantID string, req *fanoutv1.ForkRunRequest) (*Forked, error) {
	if e.records == nil {
		return nil, errNoRecordedTasks
	}
	// The request's own fields first: nothing unchecked reaches the store.
	var v validator
	v.text("", req.ProtoReflect())
	requireRunID(&v, req.GetRunId())
	if err := v.err(); err != nil {
		return nil, err
	}
	src, err := e.store.GetRun(ctx, tenantID, req.GetRunId())
	if err != nil {
		return nil, err
	}
	spec, err := forkSpec(src.GetSpec(), tenantID, req)
	if err != nil {
		return nil, err
	}
	if !req.GetDryRun() {
		// A retry: the run the key names, if it is this fork.
		if run, err := e.store.RunByKey(ctx, tenantID, req.GetIdempotencyKey()); err == nil {
			return e.existingFork(run, spec, src.GetRunId())
		}
	}
	writes, err := e.records.SentWrites(ctx, tenantID, src.GetRunId())
	if err != nil {
		return nil, err
	}
	source := newForkSource(src, writes)
	if req.GetDryRun() {
		return e.quoteFork(ctx, spec, source)
	}
	run, created, q, err := e.submit(ctx, spec, source, req.GetReserveQuote())
	if err != nil {
		return nil, err
	}
	if !created {
		return e.existingFork(run, spec, src.GetRunId())
	}
	return &Forked{Run: run, Reused: reusedSources(run), Quote: q}, nil
}

// existingFork answers a fork whose idempotency key names run: run when
// it is the same fork of the same source, else ErrSpecMismatch.
func (e *Engine) existingFork(run *fanoutv1.Run, spec *fanoutv1.RunSpec, srcID string) (*Forked, error) {
	if run.GetForkedFrom() != srcID {
		return nil, fmt.Errorf("run %s was not forked from %s: %w", run.GetRunId(), srcID, ErrSpecMismatch)
	}
	if _, _, err := e.existing(run, known(spec)); err != nil {
		return nil, err
	}
	return &Forked{Run: run, Reused: reusedSources(run)}, nil
}

// quoteFork is a dry run's answer: the quote of the fork, nothing written.
func (e *Engine) quoteFork(ctx context.Context, spec *fanoutv1.RunSpec, src *forkSource) (*Forked, error) {
	p, err := e.cfg.callerPlan(known(spec))
	if err != nil {
		return nil, err
	}
	// A spent tenant budget is what the quote says, not an error (as
	// StartRun's dry run).
	if err := e.checkTenant(ctx, p, false); err != nil && !errors.Is(err, ErrTenantExhausted) {
		return nil, err
	}
	e.sizeFirst(ctx, p)
	reused, _, why, err := e.reuse(ctx, p, src)
	if err != nil {
		return nil, err
	}
	q, err := e.quoteRun(ctx, p, spec.GetBudget().GetLimitTokens(), nil, quoteLines(reused))
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, line := range q.GetTasks() {
		if line.GetRuns() {
			line.Reason = why[int(line.GetDispatchIndex())]
		} else {
			ids = append(ids, line.GetReused().GetTaskId())
		}
	}
	return &Forked{Reused: ids, Quote: q}, nil
}

// reusedSources are the source task ids the tasks of run reused, in
// dispatch order.
func reusedSources(run *fanoutv1.Run) []string {
	var ids []string
	for _, o := range run.GetTasks() {
		if r := o.GetReused(); r != nil {
			ids = append(ids, r.GetTaskId())
		}
	}
	return ids
}

// forkSpec is the spec of the fork of src that req asks for, for tenantID:
// src's tasks in their order, each changed one replaced in place, the
// removed ones left out, the new ones after them in req's order; goal,
// budget, model and labels replaced when req sets them; req's idempotency
// key. The result is planned (validated) as any spec is.
func forkSpec(src *fanoutv1.RunSpec, tenantID string, req *fanoutv1.ForkRunRequest) (*fanoutv1.RunSpec, error) {
	var v validator
	v.text("", req.ProtoReflect())
	requireRunID(&v, req.GetRunId())
	if req.GetIdempotencyKey() == "" {
		v.add("idempotency_key", "is required")
	}
	spec := proto.CloneOf(src)
	spec.TenantId, spec.IdempotencyKey = tenantID, req.GetIdempotencyKey()
	index := map[string]int{}
	for i, t := range spec.GetTasks() {
		index[t.GetId()] = i
	}
	removed := map[string]bool{}
	for k, id := range req.GetRemoveTaskIds() {
		if _, ok := index[id]; !ok {
			v.add(fmt.Sprintf("remove_task_ids[%d]", k), "names no task of run %s: %q", req.GetRunId(), id)
		}
		removed[id] = true
	}
	seen := map[string]bool{}
	var added []*fanoutv1.TaskSpec
	for k, t := range req.GetTasks() {
		switch i, ok := index[t.GetId()]; {
		case t.GetId() == "":
			v.add(fmt.Sprintf("tasks[%d].id", k), "is required")
		case seen[t.GetId()]:
			v.add(fmt.Sprintf("tasks[%d].id", k), "%q is changed twice", t.GetId())
		case removed[t.GetId()]:
			v.add(fmt.Sprintf("tasks[%d].id", k), "%q is also in remove_task_ids", t.GetId())
		case ok:
			spec.Tasks[i] = proto.CloneOf(t)
		default:
			added = append(added, proto.CloneOf(t))
		}
		seen[t.GetId()] = true
	}
	spec.Tasks = append(slices.DeleteFunc(spec.Tasks, func(t *fanoutv1.TaskSpec) bool { return removed[t.GetId()] }), added...)
	for _, t := range spec.GetTasks() {
		for _, d := range t.GetDependsOn() {
			if removed[d] {
				v.add("remove_task_ids", "task %q depends on %q: change it too", t.GetId(), d)
			}
		}
	}
	if req.GetGoal() != "" {
		spec.Goal = req.GetGoal()
	}
	if req.GetBudget() != nil {
		spec.Budget = proto.CloneOf(req.GetBudget())
	}
	if req.GetModel() != nil {
		spec.Model = proto.CloneOf(req.GetModel())
	}
	if len(req.GetLabels()) > 0 {
		spec.Labels = maps.Clone(req.GetLabels())
	}
	return spec, v.err()
}
