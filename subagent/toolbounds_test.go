package subagent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// workerServer builds the subagent server the way a worker process does
// (cmd/fanout worker and dev, then node's newWorker): the flags' defaults
// are DefaultServerConfig's, flags applies the flags given on the command
// line, then the node fills in the ledger, the orchestrators' keys, the
// models, the worker's name and the tool log, and calls NewServer. tools
// stands in for the node's registry (built-ins plus MCP tools).
func workerServer(t *testing.T, b *bundle, m llm.Model, tools *subagent.Tools, flags func(*subagent.ServerConfig)) *subagent.Server {
	t.Helper()
	cfg := subagent.DefaultServerConfig()
	if flags != nil {
		flags(&cfg)
	}
	cfg.Ledger, cfg.Keys, cfg.Models, cfg.Name = b.ledger, testKeys, subagent.SimModels(m), "w1"
	cfg.Writes = store.NewToolCalls(b.pool, store.ToolCallsConfig{})
	cfg.Tools = tools
	srv, err := subagent.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// toolDispatch is a dispatch of task taskID allowed the given tools.
func toolDispatch(b *bundle, taskID string, tools ...string) *fanoutv1.Dispatch {
	d := request(b, taskID)
	d.Task.AllowedTools = tools
	return d
}

// repeat is n calls of the tool name.
func repeat(name string, n int) []llm.ToolCall {
	names := make([]string, n)
	for i := range names {
		names[i] = name
	}
	return calls(names...)
}

// TestWorkerRunsAtMostTheTurnCapOfOneReply: a model reply of 20 read calls,
// through a worker's subagent server configured as a worker process
// configures it (--max-tool-calls-per-turn, --tool-parallelism), runs
// exactly the per-turn cap of them, counted by the tool itself; the model
// is answered every call, the rest "not run: over the per-turn cap", and
// the iteration event reports the calls that ran. The cap is its own knob:
// neither the worker's tool parallelism (16 by default, more than the cap;
// 4 in the last case, less) nor the loop's default stands in for it.
func TestWorkerRunsAtMostTheTurnCapOfOneReply(t *testing.T) {
	t.Parallel()
	const replied = 20
	b := setup(t, 1_000_000, 50, map[string]int64{"a": 50_000, "b": 50_000, "c": 50_000, "d": 50_000})
	for _, tc := range []struct {
		name  string
		task  string
		flags func(*subagent.ServerConfig)
		want  int // calls that run
	}{
		{"defaults", "a", nil, 8},
		{"config with no flags", "b", func(c *subagent.ServerConfig) { *c = subagent.ServerConfig{} }, 8},
		{"--max-tool-calls-per-turn 3", "c", func(c *subagent.ServerConfig) { c.MaxToolCallsPerTurn = 3 }, 3},
		{"--max-tool-calls-per-turn 12 --tool-parallelism 4", "d", func(c *subagent.ServerConfig) {
			c.MaxToolCallsPerTurn, c.ToolParallelism = 12, 4
		}, 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var rec recorder
			tools, err := subagent.NewTools(rec.tool("r", subagent.EffectRead, subagent.ToolResult{Text: "ok"}))
			if err != nil {
				t.Fatal(err)
			}
			m := &scripted{calls: repeat("r", replied)}
			client := serve(t, workerServer(t, b, m, tools, tc.flags))

			stream, err := client.Execute(within(t), signed(toolDispatch(b, tc.task, "r")))
			if err != nil {
				t.Fatal(err)
			}
			msgs, err := collect(t, stream)
			if err != nil {
				t.Fatal(err)
			}

			if n := len(rec.calls()); n != tc.want {
				t.Errorf("%d of the reply's %d calls ran, want exactly the per-turn cap, %d", n, replied, tc.want)
			}
			if len(msgs) != 4 || msgs[3].GetSummary().GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
				t.Fatalf("stream = %v; want started, 2 iterations, a successful summary", msgs)
			}
			if got := msgs[1].GetIteration().GetToolCalls(); got != int32(tc.want) {
				t.Errorf("iteration 1 reports %d tool calls, want %d", got, tc.want)
			}
			res := m.results(t)
			if len(res) != replied {
				t.Fatalf("the model got %d tool results for %d calls", len(res), replied)
			}
			notRun := fmt.Sprintf("not run: over the per-turn cap of %d tool calls", tc.want)
			for i, r := range res {
				over := i >= tc.want
				if r.ToolCallID != fmt.Sprintf("c%d", i) || over != strings.HasPrefix(r.Content, notRun) ||
					over != r.IsError || !over && r.Content != "ok" {
					t.Errorf("result %d = %+v, want %s", i, r, map[bool]string{true: notRun, false: "ok"}[over])
				}
			}
			if sys := m.reqs[0].Messages[0].Content; !strings.Contains(sys, fmt.Sprintf("(at most %d run)", tc.want)) {
				t.Errorf("the system prompt does not state the cap of %d: %q", tc.want, sys)
			}
		})
	}
}

// perTask is a model whose first reply to each task is that task's calls
// and whose later replies are a final answer.
type perTask map[string][]llm.ToolCall

func (perTask) Name() string { return "scripted" }

func (p perTask) Call(_ context.Context, req llm.Request) (llm.Response, error) {
	usage := llm.Usage{InputTokens: 100, OutputTokens: 20}
	if req.Meta.Iteration == 1 {
		return llm.Response{ToolCalls: p[req.Meta.TaskID], Usage: usage, FinishReason: llm.FinishToolCalls}, nil
	}
	return llm.Response{Content: `{"facts":[{"text":"done","sources":["x"]}]}`, Usage: usage, FinishReason: llm.FinishStop}, nil
}

// inFlight counts calls in flight and the most there ever were at once.
type inFlight struct{ now, peak atomic.Int32 }

// enter counts a call in and returns how many are in flight with it.
func (f *inFlight) enter() int32 {
	n := f.now.Add(1)
	for p := f.peak.Load(); n > p && !f.peak.CompareAndSwap(p, n); p = f.peak.Load() {
	}
	return n
}

func (f *inFlight) leave() { f.now.Add(-1) }

// readGate is a read tool of one task whose calls hold until released,
// counting how many of them are in flight at once. reached is closed when
// limit are; over, shared by every gate of a test, when more are.
type readGate struct {
	inFlight
	limit   int32
	ran     atomic.Int32
	reached chan struct{}
	once    sync.Once
}

func (g *readGate) tool(name string, worker *inFlight, over func(), release <-chan struct{}) subagent.Tool {
	return subagent.Tool{Name: name, Effect: subagent.EffectRead,
		Func: func(ctx context.Context, _ subagent.ToolCall) (subagent.ToolResult, error) {
			g.ran.Add(1)
			worker.enter()
			defer worker.leave()
			n := g.enter()
			defer g.leave()
			switch {
			case n == g.limit:
				g.once.Do(func() { close(g.reached) })
			case n > g.limit:
				over()
			}
			select {
			case <-release:
				return subagent.ToolResult{Text: "read"}, nil
			case <-ctx.Done():
				return subagent.ToolResult{}, context.Cause(ctx)
			}
		}}
}

// overlapWindow is how long the test waits, once a task has 4 reads in
// flight, for a 5th to start. A loop that lets more than 4 run has already
// started the 5th (nothing is waiting for a slot): it is counted within
// microseconds, so the window only needs to outlast a busy scheduler.
const overlapWindow = time.Second

// TestReadsOfOneReplyRunFourAtATimePerTask measures the read bound of one
// task (Loop.ReadParallelism, default 4, which the worker's server leaves
// at its default) through a worker's subagent server configured as a
// worker process configures it. Two tasks run on the worker at once, each
// with a reply of 8 reads (the per-turn cap, so all of them run) of its
// own tool; every call holds until released. Once each task has 4 reads in
// flight the test waits overlapWindow for a 5th (released at once if one
// comes), then releases them all: the most in flight at once must be
// exactly 4 per task (3 or 5 fail), 8 on the worker (the bound is per task,
// not per worker; the worker's --tool-parallelism is 16), and every read
// runs.
func TestReadsOfOneReplyRunFourAtATimePerTask(t *testing.T) {
	t.Parallel()
	const perTaskBound, reads = 4, 8
	b := setup(t, 1_000_000, 50, map[string]int64{"a": 50_000, "b": 50_000})
	release := make(chan struct{})
	var releaseOnce sync.Once
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	overCh := make(chan struct{})
	var overOnce sync.Once
	over := func() { overOnce.Do(func() { close(overCh) }) }

	var worker inFlight
	gates := map[string]*readGate{}
	var tools []subagent.Tool
	model := perTask{}
	for _, task := range []string{"a", "b"} {
		g := &readGate{limit: perTaskBound, reached: make(chan struct{})}
		gates[task] = g
		tools = append(tools, g.tool("read_"+task, &worker, over, release))
		model[task] = repeat("read_"+task, reads)
	}
	reg, err := subagent.NewTools(tools...)
	if err != nil {
		t.Fatal(err)
	}
	client := serve(t, workerServer(t, b, model, reg, nil))
	t.Cleanup(releaseAll) // before the server stops, on any way out

	type outcome struct {
		msgs []*fanoutv1.ExecuteResponse
		err  error
	}
	done := map[string]chan outcome{}
	for _, task := range []string{"a", "b"} {
		ch := make(chan outcome, 1)
		done[task] = ch
		stream, err := client.Execute(within(t), signed(toolDispatch(b, task, "read_"+task)))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			var o outcome
			for {
				msg, err := stream.Recv()
				if err != nil {
					if !errors.Is(err, io.EOF) {
						o.err = err
					}
					break
				}
				o.msgs = append(o.msgs, msg)
			}
			ch <- o
		}()
	}

	deadline := time.NewTimer(patience)
	defer deadline.Stop()
wait:
	for _, task := range []string{"a", "b"} {
		select {
		case <-gates[task].reached:
		case <-overCh:
			break wait
		case <-deadline.C:
			t.Errorf("task %s never had %d reads in flight at once within %v (at most %d)",
				task, perTaskBound, patience, gates[task].peak.Load())
			break wait
		}
	}
	window := time.NewTimer(overlapWindow)
	select {
	case <-overCh:
	case <-window.C:
	}
	window.Stop()
	releaseAll()

	for _, task := range []string{"a", "b"} {
		o := await(t, done[task], "task "+task+"'s stream to end")
		if o.err != nil {
			t.Fatalf("task %s: %v", task, o.err)
		}
		if n := len(o.msgs); n == 0 || o.msgs[n-1].GetSummary().GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			t.Errorf("task %s's stream = %v; want a successful summary last", task, o.msgs)
		}
		g := gates[task]
		if p := g.peak.Load(); p != perTaskBound {
			t.Errorf("task %s had at most %d reads of one reply in flight at once, want exactly %d", task, p, perTaskBound)
		}
		if n := g.ran.Load(); n != reads {
			t.Errorf("task %s ran %d of its reply's %d reads", task, n, reads)
		}
	}
	if p := worker.peak.Load(); p != 2*perTaskBound {
		t.Errorf("the worker had at most %d reads in flight at once, want %d: %d per task, for each of 2 tasks",
			p, 2*perTaskBound, perTaskBound)
	}
}

// TestEachTaskGetsTheRegistryOfItsStart: a worker's loop is built once, but
// its tool registry may change at run time (ServerConfig.ToolsFunc: an MCP
// server's tools/list_changed). Each task is given the registry current
// when it starts: a task started after the change calls the new tool, one
// started before it called the old one.
func TestEachTaskGetsTheRegistryOfItsStart(t *testing.T) {
	t.Parallel()
	b := setup(t, 1_000_000, 50, map[string]int64{"a": 50_000, "b": 50_000})
	var before, after recorder
	registry := func(rec *recorder) *subagent.Tools {
		tools, err := subagent.NewTools(rec.tool("r", subagent.EffectRead, subagent.ToolResult{Text: "ok"}))
		if err != nil {
			t.Fatal(err)
		}
		return tools
	}
	var mu sync.Mutex
	current := registry(&before)
	m := &scripted{calls: repeat("r", 1)}
	client := serve(t, workerServer(t, b, m, nil, func(c *subagent.ServerConfig) {
		c.ToolsFunc = func() *subagent.Tools { mu.Lock(); defer mu.Unlock(); return current }
	}))
	run := func(task string) {
		t.Helper()
		stream, err := client.Execute(within(t), signed(toolDispatch(b, task, "r")))
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := collect(t, stream)
		if n := len(msgs); err != nil || n == 0 || msgs[n-1].GetSummary().GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			t.Fatalf("task %s: stream = %v, %v; want a successful summary", task, msgs, err)
		}
	}

	run("a")
	mu.Lock()
	current = registry(&after)
	mu.Unlock()
	run("b")

	if got, want := len(before.calls()), 1; got != want {
		t.Errorf("the registry before the change ran %d calls, want %d (task a's)", got, want)
	}
	if got, want := len(after.calls()), 1; got != want {
		t.Errorf("the registry after the change ran %d calls, want %d (task b's)", got, want)
	}
}
