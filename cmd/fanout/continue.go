package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

const continueUsage = `
Continue a run with more budget (docs/budget.md#continue). A run still running is
topped up; a run that ended BUDGET_EXHAUSTED reopens: its NOT_STARTED tasks run, the
tasks that ended keep their outcomes (none runs twice), and the synthesis is made again.
--quote shows what the continuation would run and spend, and writes nothing.

Usage:
  fanout continue RUN_ID --add TOKENS [--key KEY] [--reason TEXT] [--quote] [--addr HOST:PORT] [--json]

Example:
  fanout continue run_0123abcd --add 5000 --reason "the last three regions"
`

func cmdContinue(ctx context.Context, env *Env, args []string) error {
	f := newFlags("continue", continueUsage, env.Stderr)
	var cf clientFlags
	cf.register(f)
	var add int64
	var key, reason string
	var quote bool
	f.Int64Var(&add, "add", 0, "tokens added to the run's budget (required, > 0)")
	f.StringVar(&key, "key", "", "idempotency key: the same key adds once (default: a new one per call)")
	f.StringVar(&reason, "reason", "", "why, kept with the continuation in the ledger")
	f.BoolVar(&quote, "quote", false, "show the continuation's quote and write nothing")
	runID, err := parseWithRunID(f, args, env)
	if err != nil {
		return err
	}
	if add <= 0 {
		return fmt.Errorf("--add: must be a positive number of tokens, got %d", add)
	}
	if key == "" {
		key = "cli-" + rand.Text()
	}
	client, closeConn, err := cf.dial()
	if err != nil {
		return err
	}
	defer closeConn()
	resp, err := client.ContinueRun(ctx, &fanoutv1.ContinueRunRequest{RunId: runID, AddTokens: add,
		IdempotencyKey: key, Reason: reason, DryRun: quote})
	if err != nil {
		return err
	}
	if cf.json {
		printJSON(env.Stdout, resp)
		return nil
	}
	if quote {
		printQuote(env.Stdout, resp.GetQuote())
		return nil
	}
	c := resp.GetContinuation()
	fmt.Fprintf(env.Stdout, "%s: continuation %d: +%d tokens, budget now %d (%d spent before it)\n",
		runID, c.GetContinuation(), c.GetAddedTokens(), c.GetLimitTokens(), c.GetSpentBefore())
	if c.GetReopened() {
		fmt.Fprintf(env.Stdout, "reopened for %d tasks: %s (follow with: fanout watch %s)\n",
			len(c.GetTaskIds()), strings.Join(c.GetTaskIds(), ", "), runID)
	} else {
		fmt.Fprintf(env.Stdout, "topped up while running (follow with: fanout watch %s)\n", runID)
	}
	return nil
}
