package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// TestMetricsEndpoint checks that /metrics serves what the meter provider
// recorded as Prometheus text that parses. It does not call t.Parallel:
// setupTelemetry installs global providers.
func TestMetricsEndpoint(t *testing.T) { //nolint:paralleltest // global providers
	ctx := t.Context()
	tel := startTelemetry(t, false)
	if tel.addr == "" {
		t.Fatal("no /metrics address")
	}

	// The provider itself, not the global one: instruments of the global
	// meter bind to the first provider this test binary installed.
	m := tel.mp.Meter("github.com/fanout/fanout/cmd/fanout/test")
	spent, err := m.Int64Counter("fanout.budget.tokens.spent", metric.WithUnit("{token}"))
	if err != nil {
		t.Fatal(err)
	}
	spent.Add(ctx, 1234)
	latency, err := m.Float64Histogram("fanout.cancel.latency", metric.WithUnit("s"))
	if err != nil {
		t.Fatal(err)
	}
	latency.Record(ctx, 0.042)

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+tel.addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse as Prometheus text: %v", err)
	}
	var fanout []string
	for name := range families {
		if strings.HasPrefix(name, "fanout_") {
			fanout = append(fanout, name)
		}
	}
	if len(fanout) == 0 {
		t.Fatalf("no fanout_* series in /metrics; families: %d", len(families))
	}
	var got float64
	for name, f := range families {
		if strings.HasPrefix(name, "fanout_budget_tokens_spent") {
			for _, s := range f.GetMetric() {
				got += s.GetCounter().GetValue()
			}
		}
	}
	if got != 1234 {
		t.Errorf("fanout_budget_tokens_spent = %v, want 1234 (fanout series: %v)", got, fanout)
	}
	var hist bool
	for name, f := range families {
		if strings.HasPrefix(name, "fanout_cancel_latency") && len(f.GetMetric()) > 0 && f.GetMetric()[0].GetHistogram() != nil {
			hist = f.GetMetric()[0].GetHistogram().GetSampleCount() == 1
		}
	}
	if !hist {
		t.Errorf("no fanout_cancel_latency histogram with one sample (fanout series: %v)", fanout)
	}
	// The runtime's series, which operators size a node by.
	for _, name := range []string{"go_goroutines", "go_memstats_heap_inuse_bytes", "process_resident_memory_bytes"} {
		if f := families[name]; f == nil || len(f.GetMetric()) == 0 || f.GetMetric()[0].GetGauge().GetValue() <= 0 {
			t.Errorf("/metrics has no positive %s", name)
		}
	}
}

// TestUnrecordedSpansCarryContexts: without a span exporter, spans record
// nothing but carry span contexts as the SDK's default sampler would make
// them: a root starts a sampled trace, a child keeps its parent's trace id
// and flags with an id of its own, WithNewRoot ignores the parent.
func TestUnrecordedSpansCarryContexts(t *testing.T) {
	t.Parallel()
	tr := unrecorded{}.Tracer("test")
	ctx, root := tr.Start(t.Context(), "root")
	rsc := root.SpanContext()
	if root.IsRecording() || !rsc.IsValid() || !rsc.IsSampled() {
		t.Fatalf("root: recording %v, span context %+v; want a valid sampled context, not recording", root.IsRecording(), rsc)
	}
	_, child := tr.Start(ctx, "child")
	csc := child.SpanContext()
	if csc.TraceID() != rsc.TraceID() || csc.SpanID() == rsc.SpanID() || !csc.IsValid() || !csc.IsSampled() {
		t.Errorf("child %+v of root %+v: want the root's trace id, sampled, a span id of its own", csc, rsc)
	}
	_, fresh := tr.Start(ctx, "new root", trace.WithNewRoot())
	if fresh.SpanContext().TraceID() == rsc.TraceID() || !fresh.SpanContext().IsValid() {
		t.Errorf("WithNewRoot: trace id %s, the parent's %s: want a new one", fresh.SpanContext().TraceID(), rsc.TraceID())
	}
	unsampled := trace.ContextWithRemoteSpanContext(t.Context(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: rsc.TraceID(), SpanID: rsc.SpanID()}))
	if _, s := tr.Start(unsampled, "child of an unsampled parent"); s.SpanContext().IsSampled() || s.SpanContext().TraceID() != rsc.TraceID() {
		t.Errorf("child of an unsampled remote parent: %+v, want its trace id, not sampled", s.SpanContext())
	}
}

// TestPprofServesNoCommandLine: with --pprof the metrics listener serves
// Go's profiles but not /debug/pprof/cmdline, whose command line may hold a
// credential (a --database-url with its password).
func TestPprofServesNoCommandLine(t *testing.T) { //nolint:paralleltest // global providers
	ctx := t.Context()
	tel := startTelemetry(t, true)
	get := func(path string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+tel.addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, _ := get("/debug/pprof/goroutine?debug=1"); code != http.StatusOK {
		t.Fatalf("/debug/pprof/goroutine: %d, want 200 with --pprof", code)
	}
	if code, body := get("/debug/pprof/cmdline"); code == http.StatusOK || strings.Contains(body, os.Args[0]) {
		t.Errorf("/debug/pprof/cmdline: %d %q, want no command line", code, body)
	}
}

// startTelemetry sets up the process's telemetry as a server does, with
// /metrics on a free loopback port (and pprof with it if asked), shut down
// at the test's end.
func startTelemetry(t *testing.T, pprof bool) *telemetry {
	t.Helper()
	env := &Env{Stdout: io.Discard, Stderr: io.Discard, Getenv: func(string) string { return "" }}
	tel, err := setupTelemetry(t.Context(), env, "fanout-test", "127.0.0.1:0", pprof, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tel.shutdown(sctx)
	})
	return tel
}
