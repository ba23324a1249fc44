package orchestrator_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/llm"
)

// The telemetry tests install global OpenTelemetry providers, as cmd does.
// Instruments made from the global meter bind to the first provider set,
// so the providers are installed once per test binary and the tests that
// read them do not call t.Parallel: they run before any parallel test
// resumes, so what the exporter and the reader hold is theirs alone.
var (
	telOnce     sync.Once
	spanSink    *tracetest.InMemoryExporter
	metricsSink *sdkmetric.ManualReader
)

func installTelemetry(t *testing.T) {
	t.Helper()
	telOnce.Do(func() {
		spanSink = tracetest.NewInMemoryExporter()
		otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(spanSink)))
		metricsSink = sdkmetric.NewManualReader()
		otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(metricsSink)))
		otel.SetTextMapPropagator(propagation.TraceContext{})
	})
	spanSink.Reset()
}

// traceOf waits until the run's trace holds a run span and done reports
// it complete, and returns the trace's spans.
func traceOf(t *testing.T, runID string, done func([]tracetest.SpanStub) bool) []tracetest.SpanStub {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var tid trace.TraceID
		for _, s := range spanSink.GetSpans() {
			if s.Name == "run" && attr(s, "fanout.run.id").AsString() == runID {
				tid = s.SpanContext.TraceID()
			}
		}
		var spans []tracetest.SpanStub
		if tid.IsValid() {
			for _, s := range spanSink.GetSpans() {
				if s.SpanContext.TraceID() == tid {
					spans = append(spans, s)
				}
			}
			if done(spans) {
				return spans
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("trace of run %s incomplete after 10s: %d spans: %s", runID, len(spans), names(spans))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tree renders spans as an indented tree, for failure messages.
func tree(spans []tracetest.SpanStub) string {
	var b strings.Builder
	var walk func(parent trace.SpanID, depth int)
	walk = func(parent trace.SpanID, depth int) {
		for _, s := range spans {
			if s.Parent.SpanID() == parent {
				fmt.Fprintf(&b, "%s%s\n", strings.Repeat("  ", depth), s.Name)
				walk(s.SpanContext.SpanID(), depth+1)
			}
		}
	}
	walk(trace.SpanID{}, 0)
	return b.String()
}

func attr(s tracetest.SpanStub, key string) attribute.Value {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func hasAttr(s tracetest.SpanStub, key string) bool {
	return attr(s, key).Type() != attribute.EMPTY
}

func names(spans []tracetest.SpanStub) string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return strings.Join(out, ", ")
}

func byName(spans []tracetest.SpanStub, prefix string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if strings.HasPrefix(s.Name, prefix) {
			out = append(out, s)
		}
	}
	return out
}

func parentOf(spans []tracetest.SpanStub, s tracetest.SpanStub) (tracetest.SpanStub, bool) {
	for _, p := range spans {
		if p.SpanContext.SpanID() == s.Parent.SpanID() {
			return p, true
		}
	}
	return tracetest.SpanStub{}, false
}

func countPrefix(spans []tracetest.SpanStub, prefix string) int { return len(byName(spans, prefix)) }

// collect reads the metrics' cumulative state.
func collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := metricsSink.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

// sum adds up every data point of the named counter or histogram whose
// attributes include match (all points if match is empty).
func sum(rm metricdata.ResourceMetrics, name string, match ...attribute.KeyValue) float64 {
	var total float64
	ok := func(set attribute.Set) bool {
		for _, kv := range match {
			if v, found := set.Value(kv.Key); !found || v != kv.Value {
				return false
			}
		}
		return true
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if ok(p.Attributes) {
						total += float64(p.Value)
					}
				}
			case metricdata.Sum[float64]:
				for _, p := range d.DataPoints {
					if ok(p.Attributes) {
						total += p.Value
					}
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					if ok(p.Attributes) {
						total += float64(p.Sum)
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if ok(p.Attributes) {
						total += p.Sum
					}
				}
			}
		}
	}
	return total
}

// count is the number of observations of the named histogram matching attrs.
func count(rm metricdata.ResourceMetrics, name string, match ...attribute.KeyValue) uint64 {
	var n uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			if d, ok := m.Data.(metricdata.Histogram[float64]); ok {
			points:
				for _, p := range d.DataPoints {
					for _, kv := range match {
						if v, found := p.Attributes.Value(kv.Key); !found || v != kv.Value {
							continue points
						}
					}
					n += p.Count
				}
			}
		}
	}
	return n
}

// TestTelemetryOfARun follows one run through real gRPC and checks the span
// tree across the hop, the GenAI and budget attributes, and that the token
// metrics equal the ledger's spend and the model's reported usage.
func TestTelemetryOfARun(t *testing.T) { //nolint:paralleltest // global providers: see installTelemetry
	installTelemetry(t)
	b := setup(t)
	b.traced = true
	sim := llm.SimConfig{FinishAfter: 2, ToolCallsPerIteration: 2}
	w1, m1 := b.worker(t, "w1", sim, 8)
	w2, m2 := b.worker(t, "w2", sim, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w1, w2)
	before := collect(t)

	s := spec("telemetry", 3, 1_000_000)
	for _, task := range s.Tasks {
		task.AllowedTools = []string{"search", "fetch"}
	}
	evs := runStream(t, n.client, s)
	fin := checkEvents(t, evs)
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("run ended %s (%q)", fin.GetState(), fin.GetCancelCause())
	}
	runID := evs[0].GetRunStarted().GetRun().GetRunId()

	spans := traceOf(t, runID, func(spans []tracetest.SpanStub) bool {
		return countPrefix(spans, "invoke_agent ") == 3 && countPrefix(spans, "fanout.v1.SubagentService/Execute") == 6
	})
	t.Cleanup(func() {
		if t.Failed() || testing.Verbose() {
			t.Logf("the run's trace:\n%s", tree(spans))
		}
	})
	run := byName(spans, "run")[0]
	if run.Parent.IsValid() {
		t.Errorf("run span has a parent %s; want it the root of the run's trace", run.Parent.SpanID())
	}
	if len(run.Links) != 1 || !run.Links[0].SpanContext.IsValid() {
		t.Errorf("run span links %v; want one, to the Run RPC's span", run.Links)
	}
	if got := attr(run, "fanout.run.state").AsString(); got != "RUN_STATE_SUCCEEDED" {
		t.Errorf("run span fanout.run.state = %q", got)
	}
	if hasAttr(run, "fanout.cancel.cause") {
		t.Errorf("a run that succeeded has fanout.cancel.cause %q", attr(run, "fanout.cancel.cause").AsString())
	}

	agents := byName(spans, "invoke_agent ")
	for _, a := range agents {
		task := attr(a, "gen_ai.agent.name").AsString()
		if a.Name != "invoke_agent "+task || attr(a, "gen_ai.operation.name").AsString() != "invoke_agent" ||
			attr(a, "fanout.run.id").AsString() != runID {
			t.Errorf("invoke_agent span %q: attributes %v", a.Name, a.Attributes)
		}
		if attr(a, "fanout.task.status").AsString() != "SUCCEEDED" || attr(a, "fanout.task.tokens_spent").AsInt64() <= 0 {
			t.Errorf("%s: status %q, tokens %d", a.Name, attr(a, "fanout.task.status").AsString(),
				attr(a, "fanout.task.tokens_spent").AsInt64())
		}
		// invoke_agent <- gRPC server span (worker) <- gRPC client span (orchestrator) <- run.
		srv, ok := parentOf(spans, a)
		if !ok || srv.SpanKind != trace.SpanKindServer || srv.Name != "fanout.v1.SubagentService/Execute" {
			t.Fatalf("%s: parent %q (kind %v), want the worker's Execute server span", a.Name, srv.Name, srv.SpanKind)
		}
		cli, ok := parentOf(spans, srv)
		if !ok || cli.SpanKind != trace.SpanKindClient || cli.Name != "fanout.v1.SubagentService/Execute" {
			t.Fatalf("%s: grandparent %q (kind %v), want the orchestrator's Execute client span", a.Name, cli.Name, cli.SpanKind)
		}
		if cli.Parent.SpanID() != run.SpanContext.SpanID() {
			t.Errorf("%s: the Execute client span's parent is not the run span", a.Name)
		}
		if srv.SpanContext.TraceID() != run.SpanContext.TraceID() {
			t.Errorf("%s: the worker's span is in another trace", a.Name)
		}
	}

	reserved := map[int64]bool{}
	for _, r := range byName(spans, "ledger.reserve") {
		if p, _ := parentOf(spans, r); !strings.HasPrefix(p.Name, "invoke_agent ") {
			t.Errorf("ledger.reserve under %q, want invoke_agent", p.Name)
		}
		reserved[attr(r, "fanout.budget.reservation_id").AsInt64()] = true
	}
	if countPrefix(spans, "ledger.settle") == 0 {
		t.Error("no ledger.settle span in the run's trace")
	}
	chats := byName(spans, "chat ")
	if len(chats) != 6 { // 3 tasks x FinishAfter 2
		t.Errorf("%d chat spans, want 6", len(chats))
	}
	for _, c := range chats {
		if p, _ := parentOf(spans, c); !strings.HasPrefix(p.Name, "invoke_agent ") {
			t.Errorf("%s under %q, want invoke_agent", c.Name, p.Name)
		}
		if c.Name != "chat sim" || c.SpanKind != trace.SpanKindClient ||
			attr(c, "gen_ai.operation.name").AsString() != "chat" ||
			attr(c, "gen_ai.provider.name").AsString() != "sim" ||
			attr(c, "gen_ai.request.model").AsString() != "sim" ||
			attr(c, "gen_ai.request.max_tokens").AsInt64() <= 0 ||
			attr(c, "gen_ai.usage.input_tokens").AsInt64() <= 0 ||
			attr(c, "gen_ai.usage.output_tokens").AsInt64() <= 0 {
			t.Errorf("chat span %q (kind %v) attributes %v", c.Name, c.SpanKind, c.Attributes)
		}
		if id := attr(c, "fanout.budget.reservation_id").AsInt64(); !reserved[id] {
			t.Errorf("chat span's reservation %d has no ledger.reserve span", id)
		}
		if hasAttr(c, "gen_ai.input.messages") || hasAttr(c, "gen_ai.output.messages") {
			t.Error("chat span has message content, but capture is off by default")
		}
	}
	tools := byName(spans, "execute_tool ")
	if len(tools) != 6 { // 3 tasks x 1 tool iteration x 2 calls
		t.Errorf("%d execute_tool spans, want 6", len(tools))
	}
	for _, c := range tools {
		if p, _ := parentOf(spans, c); !strings.HasPrefix(p.Name, "invoke_agent ") {
			t.Errorf("%s under %q, want invoke_agent", c.Name, p.Name)
		}
		name := attr(c, "gen_ai.tool.name").AsString()
		if c.Name != "execute_tool "+name || attr(c, "gen_ai.operation.name").AsString() != "execute_tool" ||
			attr(c, "fanout.tool.effect").AsString() != "read" {
			t.Errorf("execute_tool span %q attributes %v", c.Name, c.Attributes)
		}
	}

	// Metrics: what the ledger posted, what the model reported.
	after := collect(t)
	acct, err := b.ledger.RunAccount(t.Context(), runID)
	if err != nil {
		t.Fatal(err)
	}
	if got := sum(after, "fanout.budget.tokens.spent") - sum(before, "fanout.budget.tokens.spent"); int64(got) != acct.Spent || acct.Spent == 0 {
		t.Errorf("fanout.budget.tokens.spent grew by %v; the ledger says the run spent %d", got, acct.Spent)
	}
	var usage int64
	for _, c := range append(m1.Calls(), m2.Calls()...) {
		if c.RunID == runID {
			usage += c.Usage.Total()
		}
	}
	if got := sum(after, "gen_ai.client.token.usage") - sum(before, "gen_ai.client.token.usage"); int64(got) != usage || usage == 0 {
		t.Errorf("gen_ai.client.token.usage grew by %v; the sim reported %d", got, usage)
	}
	for _, typ := range []string{"input", "output"} {
		kv := attribute.String("gen_ai.token.type", typ)
		if sum(after, "gen_ai.client.token.usage", kv) <= sum(before, "gen_ai.client.token.usage", kv) {
			t.Errorf("no gen_ai.client.token.usage of type %s", typ)
		}
	}
	ok := attribute.String("fanout.task.status", "SUCCEEDED")
	if got := sum(after, "fanout.tasks.finished", ok) - sum(before, "fanout.tasks.finished", ok); got != 3 {
		t.Errorf("fanout.tasks.finished{SUCCEEDED} grew by %v, want 3", got)
	}
	if got := count(after, "fanout.task.duration", ok) - count(before, "fanout.task.duration", ok); got != 3 {
		t.Errorf("fanout.task.duration{SUCCEEDED} has %d more observations, want 3", got)
	}
	succeeded := attribute.String("fanout.run.state", "SUCCEEDED")
	if got := count(after, "fanout.run.duration", succeeded) - count(before, "fanout.run.duration", succeeded); got != 1 {
		t.Errorf("fanout.run.duration{SUCCEEDED} has %d more observations, want 1", got)
	}
	if took := sum(after, "fanout.run.duration", succeeded) - sum(before, "fanout.run.duration", succeeded); took <= 0 {
		t.Errorf("fanout.run.duration{SUCCEEDED} grew by %vs, want the run's duration", took)
	}
	if got := count(after, "gen_ai.client.operation.duration") - count(before, "gen_ai.client.operation.duration"); got != 6 {
		t.Errorf("gen_ai.client.operation.duration has %d more observations, want 6", got)
	}
	if got := sum(after, "fanout.subagents.running"); got != 0 {
		t.Errorf("fanout.subagents.running = %v after the run", got)
	}
}

// TestTelemetryOfACancelledRun checks that the spans a cancellation ends
// carry its cause: the run, every subagent and every model call in flight.
func TestTelemetryOfACancelledRun(t *testing.T) { //nolint:paralleltest // global providers: see installTelemetry
	installTelemetry(t)
	b := setup(t)
	b.traced = true
	w1, sim := b.worker(t, "w1", llm.SimConfig{Latency: time.Minute}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w1)
	before := collect(t)

	s := spec("cancelled", 3, 1_000_000)
	started, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := started.GetRunId()
	for deadline := time.Now().Add(10 * time.Second); len(sim.Calls()) < 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d model calls started, want 3", len(sim.Calls()))
		}
	}
	if _, err := n.client.CancelRun(t.Context(), &fanoutv1.CancelRunRequest{RunId: runID, Reason: "telemetry test"}); err != nil {
		t.Fatal(err)
	}
	fin := checkEvents(t, watchAll(t, n.client, runID))
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_CANCELLED {
		t.Fatalf("run ended %s", fin.GetState())
	}

	const cause = "cancelled by caller: telemetry test"
	spans := traceOf(t, runID, func(spans []tracetest.SpanStub) bool {
		return countPrefix(spans, "invoke_agent ") == 3 && countPrefix(spans, "chat ") == 3 && len(byName(spans, "run")[0].Attributes) > 0 &&
			hasAttr(byName(spans, "run")[0], "fanout.run.state")
	})
	hasCause := func(s tracetest.SpanStub, want string) {
		t.Helper()
		if got := attr(s, "fanout.cancel.cause").AsString(); !strings.Contains(got, want) {
			t.Errorf("%s: fanout.cancel.cause %q, want it to say %q", s.Name, got, want)
		}
		for _, ev := range s.Events {
			if ev.Name == "cancelled" {
				return
			}
		}
		t.Errorf("%s: no \"cancelled\" event", s.Name)
	}
	hasCause(byName(spans, "run")[0], cause)
	for _, a := range byName(spans, "invoke_agent ") {
		if got := attr(a, "fanout.task.status").AsString(); got != "CANCELLED" {
			t.Errorf("%s: status %s, want CANCELLED", a.Name, got)
		}
		hasCause(a, "run cancelled")
	}
	for _, c := range byName(spans, "chat ") {
		hasCause(c, "run cancelled")
		if hasAttr(c, "gen_ai.usage.input_tokens") {
			t.Errorf("%s: a cancelled call has usage %v", c.Name, attr(c, "gen_ai.usage.input_tokens"))
		}
	}

	after := collect(t)
	sub := attribute.String("fanout.cancel.scope", "subagent")
	if got := count(after, "fanout.cancel.latency", sub) - count(before, "fanout.cancel.latency", sub); got != 3 {
		t.Errorf("fanout.cancel.latency{scope=subagent} has %d new observations, want 3", got)
	}
	runScope := attribute.String("fanout.cancel.scope", "run")
	if got := count(after, "fanout.cancel.latency", runScope, attribute.String("fanout.cancel.reason", "run_cancelled")) -
		count(before, "fanout.cancel.latency", runScope, attribute.String("fanout.cancel.reason", "run_cancelled")); got != 1 {
		t.Errorf("fanout.cancel.latency{scope=run,reason=run_cancelled} has %d new observations, want 1", got)
	}
	cancelled := attribute.String("fanout.task.status", "CANCELLED")
	if got := sum(after, "fanout.tasks.finished", cancelled) - sum(before, "fanout.tasks.finished", cancelled); got != 3 {
		t.Errorf("fanout.tasks.finished{CANCELLED} grew by %v, want 3", got)
	}
}

// TestTelemetryOfTheSpeculationBill: what the tasks a FIRST_SUCCESS run
// cancelled had spent is counted as fanout.tokens.discarded, exactly.
//
// The fast worker's calls wait until every task holds a reservation, so
// that the slow tasks have spent something to discard whatever the
// machine's speed (on a loaded one the first success came before the slow
// tasks' first reserve, and they were cancelled having spent nothing).
func TestTelemetryOfTheSpeculationBill(t *testing.T) { //nolint:paralleltest // global providers: see installTelemetry
	installTelemetry(t)
	b := setup(t)
	release := make(chan struct{})
	fast := b.heldWorker(t, "fast", 8, func(sim llm.Model) llm.Model { return gatedModel{sim: sim, open: release} })
	slow, _ := b.worker(t, "slow", llm.SimConfig{Latency: 30 * time.Second}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, fast, slow)
	before := collect(t)
	s := spec("speculation", 4, 100_000) // round-robin: t00, t02 fast; t01, t03 slow
	s.JoinPolicy = fanoutv1.JoinPolicy_JOIN_POLICY_FIRST_SUCCESS
	started, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(patience); ; time.Sleep(20 * time.Millisecond) { // polling the ledger
		var held int
		if err := b.pool.QueryRow(t.Context(), `SELECT count(DISTINCT account_id) FROM reservation
			WHERE run_id = $1 AND state = 'held'`, started.GetRunId()).Scan(&held); err != nil {
			t.Fatal(err)
		}
		if held == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 4 tasks held a reservation after %v", held, patience)
		}
	}
	close(release)
	fin := checkEvents(t, watchAll(t, n.client, started.GetRunId()))
	var cancelled int64
	for _, o := range fin.GetResult().GetTasks() {
		if o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_CANCELLED {
			cancelled += o.GetTokensSpent()
		}
	}
	if cancelled == 0 {
		t.Fatalf("the cancelled tasks spent nothing: %v", fin.GetResult().GetTasks())
	}
	policy := attribute.String("fanout.run.join_policy", "FIRST_SUCCESS")
	after := collect(t)
	if got := sum(after, "fanout.tokens.discarded", policy) - sum(before, "fanout.tokens.discarded", policy); got != float64(cancelled) {
		t.Errorf("fanout.tokens.discarded{FIRST_SUCCESS} grew by %v, want %d (the cancelled tasks' spend)", got, cancelled)
	}
}

// gatedModel is a model whose calls wait until open is closed.
type gatedModel struct {
	sim  llm.Model
	open <-chan struct{}
}

func (g gatedModel) Name() string { return g.sim.Name() }

func (g gatedModel) Call(ctx context.Context, req llm.Request) (llm.Response, error) {
	select {
	case <-g.open:
	case <-ctx.Done():
		return llm.Response{}, context.Cause(ctx)
	}
	return g.sim.Call(ctx, req)
}
