package mcp

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// TestCallTelemetry: a call adds its server, tool and rate wait to the
// caller's span, and the manager counts its connect and records the wait.
func TestCallTelemetry(t *testing.T) {
	t.Parallel()
	ts := newTestServer(0)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	log, _ := testLogger()
	m, err := Open(t.Context(), Options{Config: mustParse(t, serverYAML("    rpm: 60000\n", "{name: echo, effect: read}")),
		RateLimiter: llm.NewMemoryLimiter(), Logger: log, TracerProvider: tp, MeterProvider: mp, transport: ts.inMemory(nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	ctx, span := tp.Tracer("test").Start(t.Context(), "execute_tool t__echo")
	if _, err := tool(t, m, "t__echo").Func(ctx, subagent.ToolCall{Name: "t__echo", Args: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	span.End()
	attrs := map[attribute.Key]attribute.Value{}
	var connectSpan bool
	for _, s := range rec.Ended() {
		if s.Name() == "execute_tool t__echo" {
			for _, kv := range s.Attributes() {
				attrs[kv.Key] = kv.Value
			}
		}
		connectSpan = connectSpan || strings.HasPrefix(s.Name(), "mcp.connect t")
	}
	if attrs[attrServer].AsString() != "t" || attrs[attrTool].AsString() != "echo" {
		t.Errorf("span attributes %v; want the server and the tool", attrs)
	}
	if _, ok := attrs[attrRateWait]; !ok {
		t.Errorf("span attributes %v; want the rate wait", attrs)
	}
	if !connectSpan {
		t.Error("no mcp.connect span")
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			switch d := mt.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if v, _ := p.Attributes.Value(attrOutcome); p.Count > 0 && v.AsString() == "taken" {
						found[mt.Name] = true
					}
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if v, _ := p.Attributes.Value(attrServer); p.Value > 0 && v.AsString() == "t" {
						found[mt.Name] = true
					}
				}
			}
		}
	}
	for _, name := range []string{"fanout.mcp.rate.wait", "fanout.mcp.connects", "fanout.mcp.sessions"} {
		if !found[name] {
			t.Errorf("metric %s not recorded (got %v)", name, found)
		}
	}
}
