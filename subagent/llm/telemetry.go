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
)

// The sources of a rate-limit wait.
const (
	waitLimiter  = "limiter"      // the fleet's token bucket (Limiter)
	waitProvider = "provider_429" // a backoff after the provider answered 429
)

// instruments are the providers' metrics, made once from the global meter
// provider (cmd sets it; until then they are no-ops).
type instruments struct {
	wait      metric.Float64Histogram
	responses metric.Int64Counter
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
	})
	return &inst
}

func (c *caller) recordWait(ctx context.Context, source string, d time.Duration) {
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
