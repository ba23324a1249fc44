package subagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/subagent/llm"
)

// The built-in tool fan_out (docs/budget.md#nested-fan-out): offered to a
// task whose dispatch allows it (Dispatch.fan_out), it starts a child run
// of the tasks it names under the calling task, and answers with the
// child's joined facts. The call is recorded as a write is (its tool_call
// row, before anything is asked: at most once, and an attempt dispatched
// again takes it up under the same key), then asked of the orchestrator
// (Task.FanOut.Ask: a SubagentFanOut on the Execute stream), which opens
// the child and, at the child's end, answers the row; the task polls the
// row until then. While it waits the task gives its worker slot back
// (FanOut.Park): a worker full of parents waiting for their children
// would otherwise never run the children.

// FanOut is a task's allowance to fan out, and how it asks.
type FanOut struct {
	// MaxChildTasks is the most tasks one call may start.
	MaxChildTasks int
	// Ask sends the call, recorded under key, to the orchestrator.
	Ask func(key string, call FanOutCall) error
	// Park gives the task's worker slot back while it waits and returns
	// the function that takes it again. nil: it keeps it.
	Park func() (unpark func())
}

// FanOutCall is what a fan_out call asks for.
type FanOutCall struct {
	Goal        string   `json:"goal"`
	Tasks       []string `json:"tasks"`
	TokenBudget int64    `json:"token_budget"`
}

// fanOutTimeout is the fan_out tool's own timeout: none to speak of, the
// task's deadline bounds it (the child's run timeout is what the task has
// left).
const fanOutTimeout = 24 * time.Hour

// DefaultFanOutPoll is how often a task waiting for its child run reads
// its call's row (Loop.FanOutPoll).
const DefaultFanOutPoll = 200 * time.Millisecond

var fanOutSchema = json.RawMessage(`{"type":"object","properties":{` +
	`"goal":{"type":"string","description":"what the sub-tasks are for"},` +
	`"tasks":{"type":"array","items":{"type":"string"},"description":"one instruction per sub-task"},` +
	`"token_budget":{"type":"integer","description":"tokens the sub-tasks may spend together; 0: what you have left"}},` +
	`"required":["tasks"]}`)

// fanOutTool is the task's fan_out tool.
func (r *taskAttempt) fanOutTool() Tool {
	return Tool{
		Name: runs.FanOutTool,
		Description: fmt.Sprintf("Split your task: start up to %d subagents, each on one of the tasks you name, in parallel, "+
			"paid from your own budget; returns their joined findings.", r.task.FanOut.MaxChildTasks),
		Effect:   EffectWrite,
		Schema:   fanOutSchema,
		Timeout:  fanOutTimeout,
		answered: true,
		Func:     r.fanOut,
	}
}

// fanOut is the fan_out tool's Func: it asks for the child run and waits
// for its answer. A call refused before it was asked is ErrNotSent (its
// row is resolved not_sent); once asked, its row is the orchestrator's.
func (r *taskAttempt) fanOut(ctx context.Context, call ToolCall) (ToolResult, error) {
	f := r.task.FanOut
	var c FanOutCall
	if err := json.Unmarshal(call.Args, &c); err != nil {
		return ToolResult{}, fmt.Errorf("%w: fan_out: the arguments are not {goal, tasks, token_budget}: %w", ErrNotSent, err)
	}
	if n := len(c.Tasks); n == 0 || n > f.MaxChildTasks {
		return ToolResult{}, fmt.Errorf("%w: fan_out.tasks: 1 to %d tasks (fan_out.max_child_tasks), got %d",
			ErrNotSent, f.MaxChildTasks, n)
	}
	if r.Writes == nil {
		return ToolResult{}, fmt.Errorf("%w: fan_out: this worker records no tool calls", ErrNotSent)
	}
	if err := f.Ask(call.IdempotencyKey, c); err != nil {
		return ToolResult{}, fmt.Errorf("fan_out: ask the orchestrator: %w", err)
	}
	if f.Park != nil {
		defer f.Park()()
	}
	return r.awaitChild(ctx, call.IdempotencyKey)
}

// childFacts are the facts of a child run's answer to a fan_out call
// (orchestrator's childAnswer): one per "- " line, its "[...]" tail its
// sources.
func childFacts(answer string) []Fact {
	texts, sources := llm.ChildAnswerFacts(answer)
	out := make([]Fact, len(texts))
	for i, text := range texts {
		out[i] = Fact{Text: text, Sources: sources[i]}
	}
	return out
}

// awaitChild polls the fan_out call key until the orchestrator answers
// it, and returns the answer.
func (r *taskAttempt) awaitChild(ctx context.Context, key string) (ToolResult, error) {
	poll := r.FanOutPoll
	if poll <= 0 {
		poll = DefaultFanOutPoll
	}
	t := time.NewTimer(poll)
	defer t.Stop()
	for failures := 0; ; {
		select {
		case <-ctx.Done():
			return ToolResult{}, fmt.Errorf("fan_out: the task ended (%w) while its child run ran", context.Cause(ctx))
		case <-t.C:
		}
		st, err := r.Writes.WriteStatus(ctx, key, r.task.AttemptSecret)
		switch {
		case errors.Is(err, runs.ErrWriteNotFound):
			return ToolResult{}, errors.New("fan_out: the database no longer has the call's record (lost in a database failover?)")
		case err != nil:
			failures++
			r.Logger.WarnContext(ctx, "read the state of a fan_out call", "key", key, "err", err)
			t.Reset(min(poll<<min(failures, 4), maxApprovalPoll))
			continue
		case st.State == runs.WriteIssued:
			failures = 0
			t.Reset(poll)
			continue
		}
		ws, err := r.Writes.Writes(ctx, r.task.TenantID, r.task.RunID, r.task.TaskID, r.task.AttemptSecret)
		if err != nil {
			t.Reset(poll)
			continue
		}
		for _, w := range ws {
			if w.Key != key {
				continue
			}
			if w.State == runs.WriteDone {
				return ToolResult{Text: w.Result}, nil
			}
			return ToolResult{Text: "fan_out: " + w.Error, IsError: true}, nil
		}
		return ToolResult{}, errors.New("fan_out: the call's record is gone")
	}
}
