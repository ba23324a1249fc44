package main

import (
	"context"
	"encoding/binary"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	httppprof "net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	promexporter "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// telemetry owns the process's tracer and meter providers and the
// Prometheus endpoint.
type telemetry struct {
	tp      *sdktrace.TracerProvider // nil unless spans are exported
	mp      *sdkmetric.MeterProvider
	metrics *http.Server
	addr    string // the /metrics address, "" when off
}

// setupTelemetry installs global OpenTelemetry providers: spans are exported
// over OTLP only when the standard OTEL_* variables ask for it (otherwise
// they are not recorded at all: see unrecorded), metrics are
// always served as Prometheus text on metricsListen (unless empty) and
// exported over OTLP when asked. Nothing needs a collector to start. With
// pprof, the same listener also serves Go's profiles under /debug/pprof/.
func setupTelemetry(ctx context.Context, env *Env, service, metricsListen string, pprof bool, log *slog.Logger) (*telemetry, error) {
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service)))
	if err != nil {
		return nil, err
	}
	t := &telemetry{}
	var tp trace.TracerProvider = unrecorded{}
	if wantsOTLP(env, "TRACES") {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return nil, err
		}
		t.tp = sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithBatcher(exp))
		tp = t.tp
	}

	reg := prometheus.NewRegistry()
	// The Go runtime's and the process's own series (go_goroutines,
	// go_memstats_*, process_resident_memory_bytes): what an operator sizes
	// a node by (docs/capacity.md) and what bench/scale reads.
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	prom, err := prometheusReader(reg)
	if err != nil {
		return nil, err
	}
	mopts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(prom)}
	if wantsOTLP(env, "METRICS") {
		r, err := autoexport.NewMetricReader(ctx)
		if err != nil {
			return nil, err
		}
		mopts = append(mopts, sdkmetric.WithReader(r))
	}
	t.mp = sdkmetric.NewMeterProvider(mopts...)

	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(t.mp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))

	if metricsListen != "" {
		lis, err := net.Listen("tcp", metricsListen)
		if err != nil {
			// Several nodes on one host share the default port: the first
			// serves it, the others say so and go on.
			log.Warn("metrics endpoint off", "addr", metricsListen, "err", err)
		} else {
			mux := http.NewServeMux()
			mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
			if pprof {
				// Not /debug/pprof/cmdline: the command line may hold a
				// credential (a --database-url with its password).
				mux.HandleFunc("/debug/pprof/", httppprof.Index)
				mux.HandleFunc("/debug/pprof/profile", httppprof.Profile)
				mux.HandleFunc("/debug/pprof/symbol", httppprof.Symbol)
				mux.HandleFunc("/debug/pprof/trace", httppprof.Trace)
			}
			t.metrics = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
			t.addr = lis.Addr().String()
			go t.metrics.Serve(lis) //nolint:errcheck // ends with Shutdown
		}
	}
	return t, nil
}

// prometheusReader is the reader behind /metrics, registered on reg. It
// decides how otel names render in Prometheus (TestPrometheusRules renders
// the code's instruments through it).
func prometheusReader(reg prometheus.Registerer) (*promexporter.Exporter, error) {
	return promexporter.New(promexporter.WithRegisterer(reg))
}

// wantsOTLP reports whether the standard variables ask for an exporter of signal.
func wantsOTLP(env *Env, signal string) bool {
	for _, v := range []string{"OTEL_" + signal + "_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_" + signal + "_ENDPOINT"} {
		if x := env.Getenv(v); x != "" && x != "none" {
			return true
		}
	}
	return false
}

// shutdown flushes and stops everything, within ctx.
func (t *telemetry) shutdown(ctx context.Context) {
	if t.metrics != nil {
		t.metrics.Shutdown(ctx) //nolint:errcheck // best effort at exit
	}
	if t.tp != nil {
		t.tp.Shutdown(ctx) //nolint:errcheck // best effort at exit
	}
	t.mp.Shutdown(ctx) //nolint:errcheck // best effort at exit
}

// traceHandler adds the trace and span ids of the record's context to
// every log line, so logs join traces.
type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(as)}
}
func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}

// unrecorded is the tracer provider of a process that exports no spans. Its
// spans record nothing (no attributes, events or timings: nobody would read
// them) but carry span contexts as the SDK's would, with the SDK's default
// sampler (parent-based, always on): a new trace id at a root, a new span
// id each, the parent's trace id, flags and state otherwise. So trace ids
// still join logs (traceHandler), reach workers, MCP servers and model
// providers in traceparent, and a run's trace id is what it would be;
// what a running subagent costs in memory holds no span.
type unrecorded struct{ embedded.TracerProvider }

func (unrecorded) Tracer(string, ...trace.TracerOption) trace.Tracer { return unrecordedTracer{} }

type unrecordedTracer struct{ embedded.Tracer }

func (unrecordedTracer) Start(ctx context.Context, _ string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	parent := trace.SpanContextFromContext(ctx)
	if cfg := trace.NewSpanStartConfig(opts...); cfg.NewRoot() {
		parent = trace.SpanContext{}
	}
	sc := trace.SpanContextConfig{SpanID: newSpanID(), TraceFlags: trace.FlagsSampled}
	if parent.IsValid() {
		sc.TraceID, sc.TraceFlags, sc.TraceState = parent.TraceID(), parent.TraceFlags(), parent.TraceState()
	} else {
		sc.TraceID = newTraceID()
	}
	ctx = trace.ContextWithSpanContext(ctx, trace.NewSpanContext(sc))
	return ctx, trace.SpanFromContext(ctx)
}

// newSpanID and newTraceID are random valid (not all zero) ids.
func newSpanID() trace.SpanID {
	var id trace.SpanID
	for !id.IsValid() {
		binary.BigEndian.PutUint64(id[:], rand.Uint64()) //nolint:gosec // an id, not a secret (as the SDK's)
	}
	return id
}

func newTraceID() trace.TraceID {
	var id trace.TraceID
	for !id.IsValid() {
		binary.BigEndian.PutUint64(id[:8], rand.Uint64()) //nolint:gosec // as above
		binary.BigEndian.PutUint64(id[8:], rand.Uint64()) //nolint:gosec // as above
	}
	return id
}
