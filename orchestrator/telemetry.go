package orchestrator

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

const scope = "github.com/fanout/fanout/orchestrator"

// Attribute keys of the run span and the orchestrator's metrics.
const (
	attrRunID        = attribute.Key("fanout.run.id")
	attrParentRunID  = attribute.Key("fanout.run.parent_id")
	attrParentTaskID = attribute.Key("fanout.run.parent_task_id")
	attrRunTraceID   = attribute.Key("fanout.run.trace_id")
	attrTenantID     = attribute.Key("fanout.tenant.id")
	attrRunTasks     = attribute.Key("fanout.run.tasks")
	attrRunState     = attribute.Key("fanout.run.state")
	attrRunTokens    = attribute.Key("fanout.run.tokens_spent")
	attrBudgetLimit  = attribute.Key("fanout.budget.limit")
	attrOnExhaustion = attribute.Key("fanout.budget.on_exhaustion")
	attrJoinPolicy   = attribute.Key("fanout.run.join_policy")
	attrNode         = attribute.Key("fanout.node")
	attrTaskID       = attribute.Key("fanout.task.id")
	attrTaskStatus   = attribute.Key("fanout.task.status")
	attrCancelCause  = attribute.Key("fanout.cancel.cause")
	attrCancelReason = attribute.Key("fanout.cancel.reason")
	attrCancelScope  = attribute.Key("fanout.cancel.scope")
	attrBudgetSpent  = attribute.Key("fanout.budget.spent")
	attrBudgetAvail  = attribute.Key("fanout.budget.available")
	attrReusedVia    = attribute.Key("fanout.reused.via")
)

func tracer() trace.Tracer { return otel.Tracer(scope) }

type instruments struct {
	tasksFinished   metric.Int64Counter
	runsFinished    metric.Int64Counter
	runsActive      metric.Int64UpDownCounter
	cancelLatency   metric.Float64Histogram
	runDuration     metric.Float64Histogram
	taskDuration    metric.Float64Histogram
	tokensDiscarded metric.Int64Counter
	tasksHedged     metric.Int64Counter
	hedgeTokens     metric.Int64Counter
	tasksReused     metric.Int64Counter
}

// durationBuckets are the boundaries (seconds) of the run and task duration
// histograms: a sim call is tenths of a second, a real run minutes.
var durationBuckets = []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}

var (
	instOnce sync.Once
	inst     instruments
)

// metrics returns the package's instruments, made once from the global
// meter provider (cmd sets it; until then they are no-ops).
func metrics() *instruments {
	instOnce.Do(func() {
		m := otel.Meter(scope)
		inst.tasksFinished, _ = m.Int64Counter("fanout.tasks.finished", metric.WithUnit("{task}"),
			metric.WithDescription("Tasks that reached a terminal status, by status."))
		inst.runsFinished, _ = m.Int64Counter("fanout.runs.finished", metric.WithUnit("{run}"),
			metric.WithDescription("Runs that ended, by state."))
		inst.runsActive, _ = m.Int64UpDownCounter("fanout.runs.active", metric.WithUnit("{run}"),
			metric.WithDescription("Runs this orchestrator is driving."))
		inst.cancelLatency, _ = m.Float64Histogram("fanout.cancel.latency", metric.WithUnit("s"),
			metric.WithDescription(cancelLatencyDescription),
			metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
		inst.runDuration, _ = m.Float64Histogram("fanout.run.duration", metric.WithUnit("s"),
			metric.WithDescription("Runs from creation to their end (database time), by state."),
			metric.WithExplicitBucketBoundaries(durationBuckets...))
		inst.taskDuration, _ = m.Float64Histogram("fanout.task.duration", metric.WithUnit("s"),
			metric.WithDescription("Dispatched tasks from their start on a worker to their end (database time), by status."),
			metric.WithExplicitBucketBoundaries(durationBuckets...))
		inst.tokensDiscarded, _ = m.Int64Counter("fanout.tokens.discarded", metric.WithUnit("{token}"),
			metric.WithDescription("The speculation bill: tokens spent by tasks that a join policy cancelled "+
				"(FIRST_SUCCESS after a success, FAIL_FAST after a failure), by policy."))
		inst.tasksHedged, _ = m.Int64Counter("fanout.tasks.hedged", metric.WithUnit("{task}"),
			metric.WithDescription("Second attempts of hedged tasks started (TaskSpec.hedge)."))
		inst.hedgeTokens, _ = m.Int64Counter("fanout.tokens.hedge_lost", metric.WithUnit("{token}"),
			metric.WithDescription("The hedging bill: tokens spent by the attempts of hedged tasks that did not win."))
		inst.tasksReused, _ = m.Int64Counter("fanout.tasks.reused", metric.WithUnit("{task}"),
			metric.WithDescription("Tasks that took an earlier run's recorded facts instead of running, by fanout.reused.via: "+
				"fork (ForkRun) or cache (the result cache's hits)."))
	})
	return &inst
}

// cancelLatencyDescription is shared word for word with package subagent,
// which records the same instrument with scope "subagent".
const cancelLatencyDescription = "Time from hearing that work must stop to it having stopped: " +
	"scope=subagent, a worker's loop (watcher signal, stream cancel or deadline to return); " +
	"scope=run, an orchestrator's run (cancel cause to its last task ended)."

// startRunSpan starts the span that covers a run, from start.
//
// It is the root of a trace of its own, linked to the span of the RPC that
// submitted it (and that span gets the run's id and trace id), rather than
// that span's child: a run outlives a StartRun call by up to a day, and a
// trace whose root ended long before its children defeats tail sampling
// and trace-duration views; one caller's trace may also submit many runs,
// and a retried submit (same idempotency key) must not add a second run to
// it. So every run is exactly one trace, rooted at its run span, whatever
// the caller does, and the caller's trace still leads to it.
func (e *Engine) startRunSpan(ctx context.Context, start time.Time, runID string, p *plan) trace.Span {
	spec := p.spec
	opts := []trace.SpanStartOption{
		trace.WithNewRoot(),
		trace.WithTimestamp(start),
		trace.WithAttributes(
			attrRunID.String(runID),
			attrTenantID.String(p.tenantID),
			attrRunTasks.Int(len(spec.GetTasks())),
			attrBudgetLimit.Int64(spec.GetBudget().GetLimitTokens()),
			attrOnExhaustion.String(spec.GetOnExhaustion().String()),
			attrJoinPolicy.String(spec.GetJoinPolicy().String()),
			attrNode.String(e.cfg.Node),
		),
	}
	rpc := trace.SpanFromContext(ctx)
	if sc := rpc.SpanContext(); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	_, span := tracer().Start(ctx, "run", opts...)
	if tid := span.SpanContext().TraceID(); rpc.IsRecording() && tid.IsValid() {
		rpc.SetAttributes(attrRunID.String(runID), attrRunTraceID.String(tid.String()))
	}
	return span
}

// endRunSpan ends a run's span with how the run ended. cause is the run
// context's cancel cause (nil if nothing cancelled it).
func endRunSpan(span trace.Span, state fanoutv1.RunState, stateCause string, cause error, result *fanoutv1.JoinedResult,
	acct *budget.Account) {
	span.SetAttributes(attrRunState.String(state.String()), attrRunTokens.Int64(result.GetTotalTokens()))
	if acct != nil {
		span.SetAttributes(attrBudgetSpent.Int64(acct.Spent), attrBudgetAvail.Int64(acct.Available()))
	}
	if cause == nil && stateCause != "" && state != fanoutv1.RunState_RUN_STATE_SUCCEEDED &&
		state != fanoutv1.RunState_RUN_STATE_FAILED {
		cause = errors.New(stateCause) // e.g. exhausted under DRAIN: nothing was cancelled, the run was stopped
	}
	if cause != nil {
		span.SetAttributes(attrCancelCause.String(cause.Error()))
		span.AddEvent("cancelled", trace.WithAttributes(attrCancelCause.String(cause.Error())))
	}
	switch state {
	case fanoutv1.RunState_RUN_STATE_FAILED, fanoutv1.RunState_RUN_STATE_TIMED_OUT:
		span.SetStatus(otelcodes.Error, stateCause)
	}
	span.End()
}

// stopClock is when a run was told to stop (its context ended, or DRAIN
// began), for fanout.cancel.latency.
type stopClock struct{ at atomic.Int64 } // unix nanos, 0 = not stopped

func (c *stopClock) stop() { c.at.CompareAndSwap(0, time.Now().UnixNano()) }

func (c *stopClock) since() (time.Duration, bool) {
	n := c.at.Load()
	if n == 0 {
		return 0, false
	}
	return time.Since(time.Unix(0, n)), true
}
