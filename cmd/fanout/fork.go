package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

const forkUsage = `
Fork a recorded run: a new run (its own id and budget) with tasks changed, added or
removed. A task whose instruction, tools, model and inputs are unchanged, and that
succeeded in the source, reuses its facts without a model call (spend 0); its writes
are never sent again. The others run (docs/budget.md#fork).

Usage:
  fanout fork RUN_ID [--task ID=INSTRUCTION]... [--remove ID]... [--limit TOKENS]
                     [--quote] [--idempotency-key KEY] [--addr HOST:PORT] [--json]

--task ID=INSTRUCTION changes the instruction of the source's task ID (its tools,
budget and dependencies kept), or adds a task ID with the budget and iterations of
the source's first task, no tools and no dependencies.

Example:
  fanout fork run_0123abcd --task t02="look up item 2 in the 2025 filings" --quote
  fanout fork run_0123abcd --task t02="look up item 2 in the 2025 filings" --remove t05
`

func cmdFork(ctx context.Context, env *Env, args []string) error {
	f := newFlags("fork", forkUsage, env.Stderr)
	var cf clientFlags
	cf.register(f)
	var changes, removed []string
	var quote bool
	var key string
	var limit int64
	f.Func("task", "ID=INSTRUCTION: change or add a task (repeat for more)", func(s string) error {
		if id, _, ok := strings.Cut(s, "="); !ok || id == "" {
			return fmt.Errorf("want ID=INSTRUCTION, got %q", s)
		}
		changes = append(changes, s)
		return nil
	})
	f.Func("remove", "ID: leave the source's task ID out (repeat for more)", func(s string) error {
		removed = append(removed, s)
		return nil
	})
	f.BoolVar(&quote, "quote", false, "quote the fork (what runs, what is reused, the forecast) and start nothing")
	f.StringVar(&key, "idempotency-key", "", "the fork's idempotency key (same key, same run); default: a new one")
	f.Int64Var(&limit, "limit", 0, "the fork's budget in tokens; default: the source's")
	runID, err := parseWithRunID(f, args, env)
	if err != nil {
		return err
	}
	if key == "" {
		key = "fork-" + rand.Text()
	}
	client, closeConn, err := cf.dial()
	if err != nil {
		return err
	}
	defer closeConn()
	src, err := client.GetRun(ctx, &fanoutv1.GetRunRequest{RunId: runID})
	if err != nil {
		return err
	}
	req := &fanoutv1.ForkRunRequest{RunId: runID, IdempotencyKey: key, RemoveTaskIds: removed, DryRun: quote}
	req.Tasks = forkTasks(src.GetRun().GetSpec(), changes)
	if limit > 0 {
		req.Budget = proto.CloneOf(src.GetRun().GetSpec().GetBudget())
		if req.Budget == nil {
			req.Budget = &fanoutv1.Budget{}
		}
		req.Budget.LimitTokens = limit
	}
	resp, err := client.ForkRun(ctx, req)
	if err != nil {
		return err
	}
	if cf.json {
		printJSON(env.Stdout, resp)
		return nil
	}
	if q := resp.GetQuote(); q != nil {
		fmt.Fprintf(env.Stdout, "%-20s %-5s %10s  %s\n", "TASK", "RUNS", "FORECAST", "WHY")
		for _, t := range q.GetTasks() {
			fmt.Fprintf(env.Stdout, "%-20s %-5t %10d  %s\n", t.GetTaskId(), t.GetRuns(), t.GetForecastTokens(), t.GetReason())
		}
		fmt.Fprintf(env.Stdout, "forecast %d tokens (tasks %d, synthesis %d) of a %d-token budget; %d task(s) reused\n",
			q.GetForecastTokens(), q.GetTasksTokens(), q.GetSynthesisTokens(), q.GetLimitTokens(), len(resp.GetReusedTaskIds()))
		return nil
	}
	fmt.Fprintf(env.Stdout, "%s: forked from %s; reuses %d task(s) %s (follow with: fanout watch %s)\n",
		resp.GetRunId(), runID, len(resp.GetReusedTaskIds()), strings.Join(resp.GetReusedTaskIds(), ","), resp.GetRunId())
	return nil
}

// forkTasks are the TaskSpecs of --task ID=INSTRUCTION changes to src: a
// source task with its instruction replaced, or a new task.
func forkTasks(src *fanoutv1.RunSpec, changes []string) []*fanoutv1.TaskSpec {
	byID := map[string]*fanoutv1.TaskSpec{}
	for _, t := range src.GetTasks() {
		byID[t.GetId()] = t
	}
	var out []*fanoutv1.TaskSpec
	for _, c := range changes {
		id, instruction, _ := strings.Cut(c, "=")
		t := proto.CloneOf(byID[id])
		if t == nil {
			t = &fanoutv1.TaskSpec{Id: id}
			if first := src.GetTasks(); len(first) > 0 {
				t.TokenBudget, t.MaxIterations = first[0].GetTokenBudget(), first[0].GetMaxIterations()
			}
		}
		t.Instruction = instruction
		out = append(out, t)
	}
	return out
}
