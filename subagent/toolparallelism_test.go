package subagent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// workerSlotWindow is how long the test waits, once the worker has its
// bound's tool calls in flight and every task has had its reply of reads,
// for one more call. A worker that lets more in than its bound has the
// extra call start as soon as its task settles its first model call (one
// ledger statement) and runs its reads: milliseconds, even on a busy
// 2-core machine, so 2 s is a margin of about 100x. A correct worker never
// lets it in however long the window.
const workerSlotWindow = 2 * time.Second

// replyOnce is a model whose first reply to every task is calls, and whose
// later replies are a final answer; replied gets a task's id once its
// first reply is handed out.
type replyOnce struct {
	calls   []llm.ToolCall
	replied chan string
}

func (replyOnce) Name() string { return "scripted" }

func (m replyOnce) Call(_ context.Context, req llm.Request) (llm.Response, error) {
	usage := llm.Usage{InputTokens: 100, OutputTokens: 20}
	if req.Meta.Iteration == 1 {
		m.replied <- req.Meta.TaskID
		return llm.Response{ToolCalls: m.calls, Usage: usage, FinishReason: llm.FinishToolCalls}, nil
	}
	return llm.Response{Content: `{"facts":[{"text":"done","sources":["x"]}]}`, Usage: usage, FinishReason: llm.FinishStop}, nil
}

// TestWorkerHoldsExactlyToolParallelismCallsInFlight measures a worker's
// --tool-parallelism (ServerConfig.ToolParallelism, default 16): the most
// tool calls in flight on one worker, all its tasks together, through a
// worker's subagent server configured as a worker process configures it.
// Every task's model replies with 8 reads (the per-turn cap) of one shared
// read tool whose calls hold until released; a task runs 4 of its reads at
// a time, so tasks × 4 calls would be in flight without the worker's
// bound: 24 for the default (6 tasks), 12 for --tool-parallelism 5 (3
// tasks). Once every task has had its reply and the worker has the bound's
// calls in flight, the test waits workerSlotWindow for one more (released
// at once if one comes), then releases them all: the most in flight at
// once, counted by the tool, must be exactly the bound (15 or 17 of 16
// fail), and every call runs.
func TestWorkerHoldsExactlyToolParallelismCallsInFlight(t *testing.T) {
	t.Parallel()
	const reads = 8
	for _, tc := range []struct {
		name  string
		tasks int
		flags func(*subagent.ServerConfig)
		want  int32
	}{
		{"default 16", 6, nil, 16},
		{"--tool-parallelism 5", 3, func(c *subagent.ServerConfig) { c.ToolParallelism = 5 }, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ids := make([]string, tc.tasks)
			accounts := map[string]int64{}
			for i := range ids {
				ids[i] = fmt.Sprintf("t%d", i)
				accounts[ids[i]] = 50_000
			}
			b := setup(t, 1_000_000, 50, accounts)

			var worker inFlight
			var ran atomic.Int32
			release, over := make(chan struct{}), make(chan struct{})
			var releaseOnce, overOnce sync.Once
			releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
			entered := make(chan struct{}, 1)
			read := subagent.Tool{Name: "read", Effect: subagent.EffectRead,
				Func: func(ctx context.Context, _ subagent.ToolCall) (subagent.ToolResult, error) {
					ran.Add(1)
					if worker.enter() > tc.want {
						overOnce.Do(func() { close(over) })
					}
					defer worker.leave()
					select {
					case entered <- struct{}{}:
					default:
					}
					select {
					case <-release:
						return subagent.ToolResult{Text: "read"}, nil
					case <-ctx.Done():
						return subagent.ToolResult{}, context.Cause(ctx)
					}
				}}
			reg, err := subagent.NewTools(read)
			if err != nil {
				t.Fatal(err)
			}
			model := replyOnce{calls: repeat("read", reads), replied: make(chan string, tc.tasks)}
			client := serve(t, workerServer(t, b, model, reg, tc.flags))
			t.Cleanup(releaseAll) // before the server stops, on any way out

			type outcome struct {
				msgs []*fanoutv1.ExecuteResponse
				err  error
			}
			done := make([]chan outcome, tc.tasks)
			for i, task := range ids {
				done[i] = make(chan outcome, 1)
				stream, err := client.Execute(within(t), signed(toolDispatch(b, task, "read")))
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
					done[i] <- o
				}()
			}

			deadline := time.NewTimer(patience)
			defer deadline.Stop()
			replied := 0
		wait:
			for replied < tc.tasks || worker.peak.Load() < tc.want {
				select {
				case <-model.replied:
					replied++
				case <-entered:
				case <-over:
					break wait
				case <-deadline.C:
					t.Errorf("within %v: %d of %d tasks had their reply, the worker had at most %d tool calls in flight at once (want %d)",
						patience, replied, tc.tasks, worker.peak.Load(), tc.want)
					break wait
				}
			}
			window := time.NewTimer(workerSlotWindow)
			select {
			case <-over:
			case <-window.C:
			}
			window.Stop()
			releaseAll()

			for i, task := range ids {
				o := await(t, done[i], "task "+task+"'s stream to end")
				if o.err != nil {
					t.Fatalf("task %s: %v", task, o.err)
				}
				if n := len(o.msgs); n == 0 || o.msgs[n-1].GetSummary().GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
					t.Errorf("task %s's stream = %v; want a successful summary last", task, o.msgs)
				}
			}
			if p := worker.peak.Load(); p != tc.want {
				t.Errorf("the worker had at most %d tool calls in flight at once, want exactly its tool parallelism, %d (%d tasks of 4 reads at a time)",
					p, tc.want, tc.tasks)
			}
			if n := ran.Load(); n != int32(tc.tasks*reads) {
				t.Errorf("%d of the %d tasks' %d reads ran", n, tc.tasks, tc.tasks*reads)
			}
		})
	}
}
