package subagent

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/subagent/llm"
)

const scope = "github.com/fanout/fanout/subagent"

// Attribute keys. The gen_ai.* names follow the OpenTelemetry GenAI semantic
// conventions; they are defined here because the semconv package versions
// rename and drop them from release to release.
const (
	attrOperation    = attribute.Key("gen_ai.operation.name")
	attrProvider     = attribute.Key("gen_ai.provider.name")
	attrRequestModel = attribute.Key("gen_ai.request.model")
	attrMaxTokens    = attribute.Key("gen_ai.request.max_tokens")
	attrTemperature  = attribute.Key("gen_ai.request.temperature")
	attrOutputType   = attribute.Key("gen_ai.output.type")
	attrSeed         = attribute.Key("gen_ai.request.seed")
	attrInputTokens  = attribute.Key("gen_ai.usage.input_tokens")
	attrOutputTokens = attribute.Key("gen_ai.usage.output_tokens")
	attrFinish       = attribute.Key("gen_ai.response.finish_reasons")
	attrAgentName    = attribute.Key("gen_ai.agent.name")
	attrAgentID      = attribute.Key("gen_ai.agent.id")
	attrToolName     = attribute.Key("gen_ai.tool.name")
	attrToolCallID   = attribute.Key("gen_ai.tool.call.id")
	attrToolType     = attribute.Key("gen_ai.tool.type")
	attrToolArgs     = attribute.Key("gen_ai.tool.call.arguments")
	attrToolResult   = attribute.Key("gen_ai.tool.call.result")
	attrTokenType    = attribute.Key("gen_ai.token.type")
	attrInputMsgs    = attribute.Key("gen_ai.input.messages")
	attrOutputMsgs   = attribute.Key("gen_ai.output.messages")
	attrErrorType    = attribute.Key("error.type")

	attrRunID       = attribute.Key("fanout.run.id")
	attrTaskID      = attribute.Key("fanout.task.id")
	attrTaskStatus  = attribute.Key("fanout.task.status")
	attrAttempt     = attribute.Key("fanout.task.attempt")
	attrIterations  = attribute.Key("fanout.task.iterations")
	attrTokensSpent = attribute.Key("fanout.task.tokens_spent")
	attrIteration   = attribute.Key("fanout.iteration")
	attrWorker      = attribute.Key("fanout.worker")
	attrReservation = attribute.Key("fanout.budget.reservation_id")
	attrGranted     = attribute.Key("fanout.budget.granted")
	attrToolEffect  = attribute.Key("fanout.tool.effect")
	attrToolServer  = attribute.Key("fanout.tool.server")
	attrToolOutcome = attribute.Key("fanout.tool.outcome")
	attrCacheResult = attribute.Key("result")
	attrToolNotRun  = attribute.Key("fanout.tool.not_run")
	// attrToolMayHaveHappened marks a write cut off in flight.
	attrToolMayHaveHappened = attribute.Key("fanout.tool.may_have_happened")
	attrCancelCause         = attribute.Key("fanout.cancel.cause")
	attrCancelReason        = attribute.Key("fanout.cancel.reason") // a class of the cause, for metrics
	attrCancelScope         = attribute.Key("fanout.cancel.scope")
)

// The gen_ai.operation.name values fanout emits.
const (
	opInvokeAgent = "invoke_agent"
	opChat        = "chat"
	opExecuteTool = "execute_tool"
)

// outputJSON is the gen_ai.output.type of a structured-output call (the
// compression call).
const outputJSON = "json"

func tracer() trace.Tracer { return otel.Tracer(scope) }

// instruments are the package's metrics, made once from the global meter
// provider (cmd sets it; until then they are no-ops).
type instruments struct {
	tokenUsage       metric.Int64Histogram
	opDuration       metric.Float64Histogram
	running          metric.Int64UpDownCounter
	capacityUsed     metric.Int64UpDownCounter
	capacityLimit    metric.Int64UpDownCounter
	cancelLatency    metric.Float64Histogram
	overrun          metric.Int64Counter
	toolCalls        metric.Int64Counter
	toolDuration     metric.Float64Histogram
	toolInFlight     metric.Int64UpDownCounter
	toolCacheLookups metric.Int64Counter
	approvalsPending metric.Int64UpDownCounter
	approvalWait     metric.Float64Histogram
}

var (
	instOnce sync.Once
	inst     instruments
)

func metrics() *instruments {
	instOnce.Do(func() {
		m := otel.Meter(scope)
		// Bucket boundaries as the GenAI semantic conventions advise.
		inst.tokenUsage, _ = m.Int64Histogram("gen_ai.client.token.usage", metric.WithUnit("{token}"),
			metric.WithDescription("Tokens used by a model call, by token type (input, output)."),
			metric.WithExplicitBucketBoundaries(1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864))
		inst.opDuration, _ = m.Float64Histogram("gen_ai.client.operation.duration", metric.WithUnit("s"),
			metric.WithDescription("Duration of a model call, retries and rate-limit waits included."),
			metric.WithExplicitBucketBoundaries(0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92))
		inst.running, _ = m.Int64UpDownCounter("fanout.subagents.running", metric.WithUnit("{subagent}"),
			metric.WithDescription("Subagent loops running."))
		inst.capacityUsed, _ = m.Int64UpDownCounter("fanout.worker.capacity.used", metric.WithUnit("{subagent}"),
			metric.WithDescription("Worker capacity slots held by Execute calls."))
		inst.capacityLimit, _ = m.Int64UpDownCounter("fanout.worker.capacity.limit", metric.WithUnit("{subagent}"),
			metric.WithDescription("Worker capacity slots in total (ServerConfig.Capacity of the running workers)."))
		inst.cancelLatency, _ = m.Float64Histogram("fanout.cancel.latency", metric.WithUnit("s"),
			metric.WithDescription(cancelLatencyDescription),
			metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
		inst.toolCalls, _ = m.Int64Counter("fanout.tool.calls", metric.WithUnit("{call}"),
			metric.WithDescription("Tool calls by server, tool, effect and outcome (ok, error, timeout, cancelled, "+
				"not_run: over the per-turn cap, after a failed write or refused; replayed: an earlier attempt's write, not sent again; "+
				"cached: a read answered from the tenant's result cache, not called)."))
		inst.toolCacheLookups, _ = m.Int64Counter("fanout.tool_cache.lookups", metric.WithUnit("{lookup}"),
			metric.WithDescription("Lookups of read tool calls in the tenants' result cache (docs/mcp.md#the-result-cache-for-read-tools), "+
				"by result: hit (the call was answered from it), miss, error (the cache could not be read: the tool was called)."))
		inst.toolDuration, _ = m.Float64Histogram("fanout.tool.duration", metric.WithUnit("s"),
			metric.WithDescription("Duration of a tool call that ran, slot and rate waits included."),
			metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
		inst.toolInFlight, _ = m.Int64UpDownCounter("fanout.tool.in_flight", metric.WithUnit("{call}"),
			metric.WithDescription("Tool calls running on this worker, by server and tool (fleet-wide: fanout.tool.slots.held)."))
		inst.approvalsPending, _ = m.Int64UpDownCounter("fanout.approvals.pending", metric.WithUnit("{call}"),
			metric.WithDescription("Writes waiting for a person's approval on this worker, by server and tool."))
		inst.approvalWait, _ = m.Float64Histogram("fanout.approvals.wait", metric.WithUnit("s"),
			metric.WithDescription("How long a write waited for its approval on this worker, by server, tool and outcome "+
				"(approved, denied, expired, ended: the task ended first)."),
			metric.WithExplicitBucketBoundaries(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600))
		inst.overrun, _ = m.Int64Counter("fanout.subagent.overrun.tokens", metric.WithUnit("{token}"),
			metric.WithDescription("Tokens model calls used beyond their reservation: the provider billed more than "+
				"the input bound plus the output cap. The ledger records them as overrun; past every limit they are unpaid. Should stay 0."))
	})
	return &inst
}

// cancelLatencyDescription is shared word for word with package
// orchestrator, which records the same instrument with scope "run".
const cancelLatencyDescription = "Time from hearing that work must stop to it having stopped: " +
	"scope=subagent, a worker's loop (watcher signal, stream cancel or deadline to return); " +
	"scope=run, an orchestrator's run (cancel cause to its last task ended)."

// cancelReason is a low-cardinality class of a cancel cause, for metrics.
func cancelReason(cause error) string {
	switch {
	case errors.Is(cause, budget.ErrExhausted):
		return "budget_exhausted"
	case errors.Is(cause, budget.ErrRunCancelled):
		return "run_cancelled"
	case errors.Is(cause, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(cause, ErrShuttingDown):
		return "shutdown"
	default:
		return "other"
	}
}

// recordCancel marks span as ended by a cancellation with cause: the
// fanout.cancel.cause attribute and a "cancelled" event.
func recordCancel(span trace.Span, cause error) {
	if cause == nil {
		return
	}
	span.SetAttributes(attrCancelCause.String(cause.Error()))
	span.AddEvent("cancelled", trace.WithAttributes(attrCancelCause.String(cause.Error())))
}

// errorType is a low-cardinality error.type for a failed model call.
func errorType(err error) string {
	var se *llm.StatusError
	switch {
	case errors.As(err, &se):
		return strconv.Itoa(se.StatusCode)
	case errors.Is(err, llm.ErrCallTimeout):
		return "timeout"
	case errors.Is(err, llm.ErrMalformedReply):
		return "malformed_reply"
	case errors.Is(err, budget.ErrLeaseLost):
		return "lease_lost"
	case errors.Is(err, llm.ErrProvider):
		return "provider_error"
	default:
		return "_OTHER"
	}
}

// requestModel names the model a request goes to: its Model, or the
// provider's default.
func requestModel(m llm.Model, req llm.Request) string {
	if req.Model != "" {
		return req.Model
	}
	if d, ok := m.(llm.DefaultModeler); ok {
		return d.DefaultModel()
	}
	return m.Name()
}

// hearing is when a loop first heard that its run ended or it must stop.
type hearing struct{ at atomic.Int64 } // unix nanos, 0 = not yet

func (h *hearing) hear() { h.at.CompareAndSwap(0, time.Now().UnixNano()) }

func (h *hearing) time() (time.Time, bool) {
	n := h.at.Load()
	return time.Unix(0, n), n != 0
}

// startAgentSpan starts the invoke_agent span of one subagent; its parent
// is ctx's span (on a worker, the Execute call's gRPC server span).
func (r *taskAttempt) startAgentSpan(ctx context.Context) (context.Context, trace.Span) {
	attrs := []attribute.KeyValue{
		attrOperation.String(opInvokeAgent),
		attrAgentName.String(r.task.TaskID),
		attrAgentID.String(r.task.RunID + "/" + r.task.TaskID),
		attrProvider.String(r.task.Model.Name()),
		attrRequestModel.String(requestModel(r.task.Model, llm.Request{Model: r.task.ModelName})),
		attrRunID.String(r.task.RunID),
		attrTaskID.String(r.task.TaskID),
		attrAttempt.Int(r.task.Attempt),
	}
	if r.Holder != "" {
		attrs = append(attrs, attrWorker.String(r.Holder))
	}
	return tracer().Start(ctx, opInvokeAgent+" "+r.task.TaskID, trace.WithAttributes(attrs...))
}

// endAgentSpan ends the invoke_agent span with how the subagent ended and,
// if it stopped because it was told to, the cause and the time it took.
func (r *taskAttempt) endAgentSpan(ctx context.Context, span trace.Span, sum Summary, cause error, h *hearing, ended time.Time) {
	span.SetAttributes(
		attrTaskStatus.String(string(sum.Status)),
		attrTokensSpent.Int64(sum.TokensSpent),
		attrIterations.Int(sum.Iterations),
	)
	switch sum.Status {
	case StatusCancelled, StatusBudgetExhausted, StatusTimedOut:
		if cause == nil {
			cause = sum.Err // refused by the ledger, or the watcher said so under DRAIN
		}
		recordCancel(span, cause)
		if at, ok := h.time(); ok && !at.After(ended) {
			metrics().cancelLatency.Record(context.WithoutCancel(ctx), ended.Sub(at).Seconds(),
				metric.WithAttributes(attrCancelScope.String("subagent"), attrCancelReason.String(cancelReason(cause))))
		}
	case StatusFailed:
		if sum.Err != nil {
			span.RecordError(sum.Err)
			span.SetStatus(otelcodes.Error, sum.Err.Error())
		}
	}
	span.End()
}

// startChatSpan starts the span of one model call, the compression call
// included (with outputType "json").
func (r *taskAttempt) startChatSpan(ctx context.Context, res budget.Reservation, req llm.Request, outputType string) (context.Context, trace.Span, []attribute.KeyValue) {
	model := requestModel(r.task.Model, req)
	common := []attribute.KeyValue{
		attrOperation.String(opChat),
		attrProvider.String(r.task.Model.Name()),
		attrRequestModel.String(model),
	}
	attrs := append(common[:len(common):len(common)],
		attrMaxTokens.Int(req.MaxTokens),
		attrReservation.Int64(int64(res.ID)),
		attrGranted.Int64(res.Amount),
		attrRunID.String(r.task.RunID),
		attrTaskID.String(r.task.TaskID),
		attrIteration.Int(req.Meta.Iteration),
	)
	if req.Temperature != 0 {
		attrs = append(attrs, attrTemperature.Float64(req.Temperature))
	}
	if req.Seed != 0 {
		attrs = append(attrs, attrSeed.Int64(req.Seed))
	}
	if outputType != "" {
		attrs = append(attrs, attrOutputType.String(outputType))
	}
	if r.CaptureContent {
		attrs = append(attrs, attrInputMsgs.String(messagesJSON(req.Messages)))
	}
	ctx, span := tracer().Start(ctx, opChat+" "+model, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	return ctx, span, common
}

// endChatSpan ends a model call's span and records its metrics. ctx is the
// iteration's context: if it ended, the call was cancelled.
func (r *taskAttempt) endChatSpan(ctx context.Context, span trace.Span, common []attribute.KeyValue, start time.Time,
	resp llm.Response, err error) {
	mctx := context.WithoutCancel(ctx)
	m := metrics()
	dattrs := common
	switch {
	case err == nil:
		span.SetAttributes(
			attrInputTokens.Int64(resp.Usage.InputTokens),
			attrOutputTokens.Int64(resp.Usage.OutputTokens),
			attrFinish.StringSlice([]string{string(resp.FinishReason)}),
		)
		if r.CaptureContent {
			span.SetAttributes(attrOutputMsgs.String(messagesJSON([]llm.Message{{
				Role: llm.RoleAssistant, Content: resp.Content, ToolCalls: resp.ToolCalls}})))
		}
		m.tokenUsage.Record(mctx, resp.Usage.InputTokens, metric.WithAttributes(append(common, attrTokenType.String("input"))...))
		m.tokenUsage.Record(mctx, resp.Usage.OutputTokens, metric.WithAttributes(append(common, attrTokenType.String("output"))...))
	case ctx.Err() != nil:
		recordCancel(span, context.Cause(ctx))
		dattrs = append(common, attrErrorType.String("cancelled"))
	default:
		et := errorType(err)
		span.SetAttributes(attrErrorType.String(et))
		span.RecordError(err)
		span.SetStatus(otelcodes.Error, err.Error())
		dattrs = append(common, attrErrorType.String(et))
	}
	m.opDuration.Record(mctx, time.Since(start).Seconds(), metric.WithAttributes(dattrs...))
	span.End()
}

// reportOverrun makes a call's usage past its reservation loud. The
// reservation is an upper bound of what the call can cost, so this means a
// provider billed more than the bound allows: tokens spent past what the
// ledger granted, unpaid if no limit has room for them.
func (r *taskAttempt) reportOverrun(ctx context.Context, res budget.Reservation, u llm.Usage) {
	over := u.Total() - res.Amount
	r.Logger.WarnContext(ctx, "model call used more tokens than its reservation",
		"run_id", r.task.RunID, "task_id", r.task.TaskID, "reservation", res.ID,
		"requested", res.Requested, "granted", res.Amount, "actual", u.Total(),
		"input_tokens", u.InputTokens, "output_tokens", u.OutputTokens, "overrun", over,
		"provider", r.task.Model.Name())
	metrics().overrun.Add(context.WithoutCancel(ctx), over, metric.WithAttributes(attrProvider.String(r.task.Model.Name())))
}

// startToolSpan starts the execute_tool span of one call of tool (the
// zero Tool if c names none the task may call).
func (r *taskAttempt) startToolSpan(ctx context.Context, c llm.ToolCall, tool Tool) (context.Context, trace.Span) {
	attrs := []attribute.KeyValue{
		attrOperation.String(opExecuteTool),
		attrToolName.String(c.Name),
		attrToolCallID.String(c.ID),
		attrToolType.String("function"),
		attrToolEffect.String(r.effect(c).String()),
		attrToolServer.String(toolServer(tool)),
		attrRunID.String(r.task.RunID),
		attrTaskID.String(r.task.TaskID),
	}
	if r.CaptureContent {
		attrs = append(attrs, attrToolArgs.String(string(c.Args)))
	}
	return tracer().Start(ctx, opExecuteTool+" "+c.Name, trace.WithAttributes(attrs...))
}

// endToolSpan ends a tool call's span and records its metrics.
func (r *taskAttempt) endToolSpan(ctx context.Context, span trace.Span, tool Tool, o toolOutcome, started time.Time) {
	outcome := outcomeOK
	switch {
	case o.notRun != "":
		outcome = outcomeNotRun
		span.SetAttributes(attrToolNotRun.String(o.notRun))
	case o.cached:
		outcome = outcomeCached
	case !o.ran:
		outcome = outcomeReplayed
	case o.timedOut:
		outcome = outcomeTimeout
		span.SetAttributes(attrErrorType.String("timeout"))
		span.SetStatus(otelcodes.Error, "the tool call timed out")
	case o.err != nil && ctx.Err() != nil:
		outcome = outcomeCutOff
		recordCancel(span, context.Cause(ctx))
	case o.err != nil || o.res.IsError:
		// A tool's error text is the tool's content (a server's message may
		// quote what it was given): on the span only with CaptureContent.
		outcome = outcomeError
		span.SetAttributes(attrErrorType.String("tool_error"))
		span.SetStatus(otelcodes.Error, "the tool reported an error")
		if r.CaptureContent && o.err != nil {
			span.RecordError(o.err)
		}
	}
	if o.unknown {
		span.SetAttributes(attrToolMayHaveHappened.Bool(true))
	}
	if r.CaptureContent && o.res.Text != "" {
		span.SetAttributes(attrToolResult.String(o.res.Text))
	}
	span.SetAttributes(attrToolOutcome.String(outcome))
	span.End()
	ctx = context.WithoutCancel(ctx)
	m := metrics()
	attrs := toolMetricAttrs(tool)
	m.toolCalls.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(append(attrs.ToSlice(),
		attrToolEffect.String(tool.Effect.String()), attrToolOutcome.String(outcome))...)))
	if o.ran {
		m.toolDuration.Record(ctx, time.Since(started).Seconds(), metric.WithAttributeSet(attrs))
	}
}

// toolServer is a tool's server for telemetry: "builtin" for a built-in,
// "_unknown" for a name the model made up (never its text: cardinality).
func toolServer(t Tool) string {
	switch {
	case t.Name == "":
		return "_unknown"
	case t.Server == "":
		return "builtin"
	}
	return t.Server
}

// toolMetricAttrs are the server and tool attributes of a call's metrics;
// a tool the task may not call is counted as "_unknown".
func toolMetricAttrs(t Tool) attribute.Set {
	name := t.Name
	if name == "" {
		name = "_unknown"
	}
	return attribute.NewSet(attrToolServer.String(toolServer(t)), attrToolName.String(name))
}

// messagesJSON renders messages in the shape of the GenAI conventions'
// gen_ai.input.messages: role and parts.
func messagesJSON(msgs []llm.Message) string {
	type part struct {
		Type      string          `json:"type"`
		Content   string          `json:"content,omitempty"`
		ID        string          `json:"id,omitempty"`
		Name      string          `json:"name,omitempty"`
		Arguments json.RawMessage `json:"arguments,omitempty"`
		Response  string          `json:"response,omitempty"`
	}
	type message struct {
		Role  string `json:"role"`
		Parts []part `json:"parts"`
	}
	out := make([]message, 0, len(msgs))
	for _, m := range msgs {
		msg := message{Role: string(m.Role)}
		switch {
		case m.Role == llm.RoleTool:
			msg.Parts = append(msg.Parts, part{Type: "tool_call_response", ID: m.ToolCallID, Response: m.Content})
		case m.Content != "":
			msg.Parts = append(msg.Parts, part{Type: "text", Content: m.Content})
		}
		for _, c := range m.ToolCalls {
			msg.Parts = append(msg.Parts, part{Type: "tool_call", ID: c.ID, Name: c.Name, Arguments: c.Args})
		}
		out = append(out, msg)
	}
	b, err := json.Marshal(out)
	if err != nil {
		return ""
	}
	return string(b)
}
