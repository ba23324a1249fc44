package orchestrator

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// The engine's side of the tool-call and spend RPCs: the adapters call
// these, never the stores behind them.

// errNoToolCallStore and errNoSpendReader: the engine was built without
// Params.Approvals or Params.Spend (the adapter answers UNIMPLEMENTED).
var (
	errNoToolCallStore = errors.New("this orchestrator has no tool call store")
	errNoSpendReader   = errors.New("this orchestrator has no spend reader")
)

// PendingWrites returns up to limit of the tenant's writes waiting for
// approval (of run runID, or every run's when ""), oldest first, after the
// cursor (afterCreated, afterCallID).
func (e *Engine) PendingWrites(ctx context.Context, tenantID, runID string, afterCreated time.Time, afterCallID string,
	limit int) ([]runs.Write, error) {
	if e.appr == nil {
		return nil, errNoToolCallStore
	}
	return e.appr.PendingWrites(ctx, tenantID, runID, afterCreated, afterCallID, limit)
}

// RunWrites returns up to limit of the writes of the tenant's run runID,
// oldest first, after the cursor, with their decisions.
func (e *Engine) RunWrites(ctx context.Context, tenantID, runID string, afterCreated time.Time, afterCallID string,
	limit int) ([]runs.LoggedWrite, error) {
	if e.appr == nil {
		return nil, errNoToolCallStore
	}
	return e.appr.RunWrites(ctx, tenantID, runID, afterCreated, afterCallID, limit)
}

// Decide records actor's decision on the tenant's call callID (secret: the
// key's, as its caller presented it; see Approvals.DecideAs) and, when it
// was recorded now, appends ApprovalDecided to the call's run. The
// decision stands if the event cannot be appended: the task hears of it
// from the database; watchers miss its event.
func (e *Engine) Decide(ctx context.Context, tenantID, callID string, approve bool, actor, secret, reason string) (runs.Decision, error) {
	if e.appr == nil {
		return runs.Decision{}, errNoToolCallStore
	}
	d, err := e.appr.DecideAs(ctx, tenantID, callID, approve, actor, secret, reason)
	if err != nil || !d.Recorded {
		return d, err
	}
	ev := &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_ApprovalDecided{ApprovalDecided: &fanoutv1.ApprovalDecided{
		CallId: d.CallID, TaskId: d.TaskID, Tool: d.Tool, Approved: d.Approved, Reason: d.Reason, Actor: d.Actor,
		DecidedAt: timestamppb.New(d.DecidedAt)}}}
	if _, err := e.store.AppendEvent(context.WithoutCancel(ctx), d.RunID, ev); err != nil && !errors.Is(err, runs.ErrEnded) {
		e.cfg.Logger.WarnContext(ctx, "append ApprovalDecided", slog.String("run_id", d.RunID), slog.String("call_id", d.CallID),
			slog.Any("err", err))
	}
	return d, nil
}

// Spend returns tenantID's spend per UTC day from fromDay to toDay, and
// that of runIDs (SpendReader.Report).
func (e *Engine) Spend(ctx context.Context, tenantID, fromDay, toDay string, runIDs []string) (runs.SpendReport, error) {
	if e.spend == nil {
		return runs.SpendReport{}, errNoSpendReader
	}
	return e.spend.Report(ctx, tenantID, fromDay, toDay, runIDs)
}
