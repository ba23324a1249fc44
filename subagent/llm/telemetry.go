package llm

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

const scope = "github.com/fanout/fanout/subagent/llm"

const (
	attrProvider   = attribute.Key("gen_ai.provider.name")
	attrStatusCode = attribute.Key("http.response.status_code")
	attrErrorType  = attribute.Key("error.type")
	attrWaitSource = attribute.Key("fanout.ratelimit.source")
	attrDimension  = attribute.Key("fanout.ratelimit.dimension")
	attrCeiling    = attribute.Key("fanout.ratelimit.ceiling")
	attrTenant     = attribute.Key("fanout.tenant.id")
	attrModel      = attribute.Key("gen_ai.request.model")
)

// The values of fanout.ratelimit.dimension and fanout.ratelimit.ceiling.
const (
	dimRPM            = "rpm"
	dimTPM            = "tpm"
	ceilingStated     = "stated"     // the provider's limit, learned from its replies
	ceilingConfigured = "configured" // the worker's flags (--openai-rpm ...)
	ceilingEffective  = "effective"  // what the Limiter enforces: min(stated, configured) x headroom
)

// The sources of a rate-limit wait.
const (
	waitLimiter  = "limiter"      // the fleet's token bucket (Limiter)
	waitProvider = "provider_429" // a backoff after the provider answered 429
)

// instruments are the providers' metrics, made once from the global meter
// provider (cmd sets it; until then they are no-ops).
type instruments struct {
	wait        metric.Float64Histogram
	responses   metric.Int64Counter
	rateLimited metric.Int64Counter
	limit       metric.Int64Gauge
	requests    metric.Int64Counter
	tokens      metric.Int64Counter
}

var (
	instOnce sync.Once
	inst     instruments
)

func metrics() *instruments {
	instOnce.Do(func() {
		m := otel.Meter(scope)
		inst.wait, _ = m.Float64Histogram("fanout.ratelimit.wait", metric.WithUnit("s"),
			metric.WithDescription("Time a model call waited for rate limits: source=limiter, the fleet's bucket before an attempt; source=provider_429, the backoff after a 429."),
			metric.WithExplicitBucketBoundaries(0, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
		inst.responses, _ = m.Int64Counter("fanout.provider.responses", metric.WithUnit("{response}"),
			metric.WithDescription("Model provider attempts by HTTP status (429 = rate limited); error.type when no status came back."))
		inst.rateLimited, _ = m.Int64Counter("fanout.provider.rate_limited", metric.WithUnit("{response}"),
			metric.WithDescription("429 replies of model providers, by provider and, when the call names it, tenant (by run: the \"model call retried\" log lines carry run_id)."))
		inst.limit, _ = m.Int64Gauge("fanout.ratelimit.limit", metric.WithUnit("1/min"),
			metric.WithDescription("A provider key's per-minute ceiling for a model: dimension rpm or tpm; ceiling stated (learned from the provider's replies), configured (the worker's flags) or effective (min(stated, configured) x headroom, what the fleet's limiter enforces)."))
		inst.requests, _ = m.Int64Counter("fanout.ratelimit.requests", metric.WithUnit("{request}"),
			metric.WithDescription("Attempts sent to a provider by this process, by model, each one request taken from the key's RPM for the model; rate x 60 over the effective rpm ceiling is the share used."))
		inst.tokens, _ = m.Int64Counter("fanout.ratelimit.tokens", metric.WithUnit("{token}"),
			metric.WithDescription("Tokens this process's attempts hold of the key's TPM for a model once each attempt ends: real usage, the whole bound when usage is unknown, 0 for an error reply; rate x 60 over the effective tpm ceiling is the share used."))
	})
	return &inst
}

func (c *caller) recordWait(ctx context.Context, source string, d time.Duration) {
	addWait(ctx, d)
	metrics().wait.Record(context.WithoutCancel(ctx), d.Seconds(),
		metric.WithAttributes(attrProvider.String(c.provider), attrWaitSource.String(source)))
}

// recordAttempt counts one attempt's outcome: its HTTP status, or why
// there was none.
func (c *caller) recordAttempt(ctx context.Context, err error, timedOut bool) {
	attrs := []attribute.KeyValue{attrProvider.String(c.provider)}
	var se *StatusError
	switch {
	case err == nil:
		attrs = append(attrs, attrStatusCode.Int(200))
	case errors.As(err, &se):
		attrs = append(attrs, attrStatusCode.Int(se.StatusCode))
	case ctx.Err() != nil:
		attrs = append(attrs, attrErrorType.String("cancelled"))
	case timedOut:
		attrs = append(attrs, attrErrorType.String("timeout"))
	case errors.Is(err, ErrMalformedReply):
		attrs = append(attrs, attrErrorType.String("malformed_reply"))
	default:
		attrs = append(attrs, attrErrorType.String("transport"))
	}
	metrics().responses.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(attrs...))
}

// recordLimits sets a model's ceilings (stated, configured and effective)
// when its bucket is defined.
func (c *caller) recordLimits(ctx context.Context, model string, stated, configured, effective RateLimit) {
	c.recordCeilings(ctx, model, ceilingStated, stated)
	c.recordCeilings(ctx, model, ceilingConfigured, configured)
	c.recordCeilings(ctx, model, ceilingEffective, effective)
}

// recordStated sets a model's stated ceilings when a reply changes them.
func (c *caller) recordStated(ctx context.Context, model string, stated RateLimit) {
	c.recordCeilings(ctx, model, ceilingStated, stated)
}

func (c *caller) recordCeilings(ctx context.Context, model, ceiling string, l RateLimit) {
	ctx = context.WithoutCancel(ctx)
	for _, p := range []struct {
		dim string
		v   int64
	}{{dimRPM, l.RPM}, {dimTPM, l.TPM}} {
		if p.v > 0 {
			metrics().limit.Record(ctx, p.v, metric.WithAttributes(attrProvider.String(c.provider), attrModel.String(model),
				attrDimension.String(p.dim), attrCeiling.String(ceiling)))
		}
	}
}

// recordUse counts one attempt's share of the key's limits for model.
func (c *caller) recordUse(ctx context.Context, model string, tokens int64) {
	ctx = context.WithoutCancel(ctx)
	c.mu.Lock()
	model = c.limitsOf(model, time.Now()).metricModel
	c.mu.Unlock()
	attrs := metric.WithAttributes(attrProvider.String(c.provider), attrModel.String(model))
	metrics().requests.Add(ctx, 1, attrs)
	if tokens > 0 {
		metrics().tokens.Add(ctx, tokens, attrs)
	}
}

// recordRateLimited counts a 429, by provider and, if known, tenant. Not
// by run: a label per run would make a new series for every run, kept
// until the process exits.
func (c *caller) recordRateLimited(ctx context.Context, meta Meta) {
	attrs := []attribute.KeyValue{attrProvider.String(c.provider)}
	if meta.TenantID != "" {
		attrs = append(attrs, attrTenant.String(meta.TenantID))
	}
	metrics().rateLimited.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(attrs...))
}
