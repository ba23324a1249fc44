package mcp

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

const scope = "github.com/fanout/fanout/subagent/mcp"

// Attribute keys of the spans and metrics of MCP calls. The loop's
// execute_tool span already has gen_ai.tool.name (the model-facing name);
// these add where the call went.
const (
	attrServer    = attribute.Key("fanout.mcp.server")
	attrTool      = attribute.Key("fanout.mcp.tool") // the tool's name on its server
	attrSlotWait  = attribute.Key("fanout.mcp.slot_wait")
	attrRateWait  = attribute.Key("fanout.mcp.rate_wait")
	attrRetried   = attribute.Key("fanout.mcp.retried") // sent again on a fresh session
	attrOutcome   = attribute.Key("fanout.mcp.outcome")
	attrTransport = attribute.Key("fanout.mcp.transport")
)

// instruments are a Manager's metrics.
type instruments struct {
	slotWait metric.Float64Histogram
	rateWait metric.Float64Histogram
	connects metric.Int64Counter
	sessions metric.Int64UpDownCounter
}

var waitBuckets = metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

func newInstruments(mp metric.MeterProvider) instruments {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(scope)
	var in instruments
	// Errors are only possible for invalid names or options, fixed here.
	in.slotWait, _ = m.Float64Histogram("fanout.mcp.slot.wait", metric.WithUnit("s"),
		metric.WithDescription("Time an MCP tool call waited for its fleet-wide slots (max_in_flight of its server and tool), by server, tool and outcome (acquired, ended)."),
		waitBuckets)
	in.rateWait, _ = m.Float64Histogram("fanout.mcp.rate.wait", metric.WithUnit("s"),
		metric.WithDescription("Time an MCP tool call waited for its server's rpm bucket, by server and outcome (taken, ended)."),
		waitBuckets)
	in.connects, _ = m.Int64Counter("fanout.mcp.connects", metric.WithUnit("{connect}"),
		metric.WithDescription("Sessions opened to MCP servers (the first and every reconnect), by server and outcome (ok, error)."))
	in.sessions, _ = m.Int64UpDownCounter("fanout.mcp.sessions", metric.WithUnit("{session}"),
		metric.WithDescription("MCP sessions open, by server: one per configured server per worker while it is up."))
	return in
}

func tracerOf(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(scope)
}
