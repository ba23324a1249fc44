package store

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

const scope = "github.com/fanout/fanout/store"

// Attribute keys of ledger spans and metrics.
const (
	AttrRequested     = attribute.Key("fanout.budget.requested")
	AttrGranted       = attribute.Key("fanout.budget.granted")
	AttrAvailable     = attribute.Key("fanout.budget.available_after")
	AttrReservationID = attribute.Key("fanout.budget.reservation_id")
	AttrEstimated     = attribute.Key("fanout.budget.estimated")
	AttrActual        = attribute.Key("fanout.budget.actual")
	AttrAccount       = attribute.Key("fanout.budget.account_id")
	AttrOutcome       = attribute.Key("fanout.budget.outcome")
	AttrOperation     = attribute.Key("fanout.ledger.operation")
	AttrRunID         = attribute.Key("fanout.run.id")
	// AttrDBOperation names the store call a database retry was for
	// ("ledger.settle", "runs.append_events", ...).
	AttrDBOperation = attribute.Key("fanout.db.operation")
	// AttrSQLState is the SQLSTATE of a retried database error, or
	// "connection" for a connection-level error without one (OpenTelemetry's
	// db.response.status_code).
	AttrSQLState = attribute.Key("db.response.status_code")
)

// instruments are the store's metrics, made once from the global meter
// provider (which cmd sets; until then they are no-ops).
type instruments struct {
	duration metric.Float64Histogram
	reserved metric.Int64Counter
	spent    metric.Int64Counter
	retries  metric.Int64Counter
}

var (
	instOnce sync.Once
	inst     instruments
)

func metrics() *instruments {
	instOnce.Do(func() {
		m := otel.Meter(scope)
		inst.duration, _ = m.Float64Histogram("fanout.ledger.operation.duration", metric.WithUnit("s"),
			metric.WithDescription("Time of one ledger operation, by operation and outcome."),
			metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
		inst.reserved, _ = m.Int64Counter("fanout.budget.tokens.reserved", metric.WithUnit("{token}"),
			metric.WithDescription("Tokens granted by reservations."))
		inst.spent, _ = m.Int64Counter("fanout.budget.tokens.spent", metric.WithUnit("{token}"),
			metric.WithDescription("Tokens posted as spent; estimated=true for work cancelled in flight or leases that expired."))
		inst.retries, _ = m.Int64Counter("fanout.db.retries", metric.WithUnit("{retry}"),
			metric.WithDescription("Store calls tried again after a transient database error, by operation and SQLSTATE."))
	})
	return &inst
}

func tracer() trace.Tracer { return otel.Tracer(scope) }

// observe starts a span for a ledger operation; the returned func ends it
// with the outcome and records its duration.
func observe(ctx context.Context, op string, attrs ...attribute.KeyValue) (context.Context, func(r *ledgerResult, err error, more ...attribute.KeyValue)) {
	start := time.Now()
	ctx, span := tracer().Start(ctx, "ledger."+op, trace.WithAttributes(attrs...), trace.WithSpanKind(trace.SpanKindClient))
	return ctx, func(r *ledgerResult, err error, more ...attribute.KeyValue) {
		outcome := "error"
		if r != nil && r.Outcome != "" {
			outcome = r.Outcome // a refusal (exhausted, conflict, ...) is an outcome, not an error
		}
		if err != nil {
			if cause := context.Cause(ctx); cause != nil {
				span.SetAttributes(attribute.String("fanout.cancel.cause", cause.Error()))
			}
		}
		if r != nil && r.ReservationID != nil {
			span.SetAttributes(AttrReservationID.Int64(*r.ReservationID))
		}
		if r != nil && r.RunAvailable != nil {
			span.SetAttributes(AttrAvailable.Int64(*r.RunAvailable))
		}
		span.SetAttributes(append(more, AttrOutcome.String(outcome))...)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
		metrics().duration.Record(context.WithoutCancel(ctx), time.Since(start).Seconds(),
			metric.WithAttributes(AttrOperation.String(op), AttrOutcome.String(outcome)))
	}
}

// countReserved and countSpent feed the token counters from what the ledger
// actually posted (so the counters equal the ledger's totals).
func countReserved(ctx context.Context, n int64) {
	if n > 0 {
		metrics().reserved.Add(context.WithoutCancel(ctx), n)
	}
}

func countSpent(ctx context.Context, n int64, estimated bool) {
	if n > 0 {
		metrics().spent.Add(context.WithoutCancel(ctx), n, metric.WithAttributes(AttrEstimated.Bool(estimated)))
	}
}

// countRetry counts one retry of store call op after an error named code.
func countRetry(ctx context.Context, op, code string) {
	metrics().retries.Add(context.WithoutCancel(ctx), 1,
		metric.WithAttributes(AttrDBOperation.String(op), AttrSQLState.String(code)))
}

// queryTracer traces every pgx query and batch as a client span.
type queryTracer struct{}

var (
	_ pgx.QueryTracer = queryTracer{}
	_ pgx.BatchTracer = queryTracer{}
)

type spanKey struct{}

func dbSpan(ctx context.Context, name, sql string) context.Context {
	ctx, span := tracer().Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("db.system.name", "postgresql"),
		attribute.String("db.query.text", sql), // fanout's SQL is static: values travel as parameters
	))
	return context.WithValue(ctx, spanKey{}, span)
}

func endDBSpan(ctx context.Context, err error) {
	span, ok := ctx.Value(spanKey{}).(trace.Span)
	if !ok {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// operationName is the SQL verb of a statement, the span's name.
func operationName(sql string) string {
	verb, _, _ := strings.Cut(strings.TrimSpace(sql), " ")
	return strings.ToUpper(verb)
}

func (queryTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return dbSpan(ctx, operationName(d.SQL), d.SQL)
}

func (queryTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	endDBSpan(ctx, d.Err)
}

func (queryTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return dbSpan(ctx, "BATCH", "")
}

func (queryTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (queryTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchEndData) {
	endDBSpan(ctx, d.Err)
}
