package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

const spendUsage = `
Show the tenant's spend per UTC day in tokens and in money, at the prices the
operator set (GetSpend; a key with scope audit), and optionally that of some
runs: what the web console's spend page shows.

Usage:
  fanout spend [--from YYYY-MM-DD] [--to YYYY-MM-DD] [--run RUN_ID]... [--addr HOST:PORT] [--json]

Example:
  fanout spend --from 2026-11-01
`

func cmdSpend(ctx context.Context, env *Env, args []string) error {
	f := newFlags("spend", spendUsage, env.Stderr)
	var cf clientFlags
	cf.register(f)
	var from, to string
	var runIDs listFlag
	f.StringVar(&from, "from", "", "first UTC day (default: 30 days before --to)")
	f.StringVar(&to, "to", "", "last UTC day, inclusive (default: today)")
	f.Var(&runIDs, "run", "a run whose spend to show too (repeat for more; at most 200)")
	if err := parseFlags(f, args, env); err != nil {
		return err
	}
	client, closeConn, err := cf.dial()
	if err != nil {
		return err
	}
	defer closeConn()
	resp, err := client.GetSpend(ctx, &fanoutv1.GetSpendRequest{FromDay: from, ToDay: to, RunIds: runIDs})
	if err != nil {
		return err
	}
	if cf.json {
		printJSON(env.Stdout, resp)
		return nil
	}
	fmt.Fprintf(env.Stdout, "spend from %s to %s (UTC days)\n", resp.GetFromDay(), resp.GetToDay())
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "DAY\tRUNS\tCOST\tCURRENCY\tPRICED TOKENS\tOF WHICH WORST CASE\tUNPRICED TOKENS\t")
	for _, d := range resp.GetDays() {
		s := d.GetSpend()
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%d\t%d\t\n", d.GetDay(), d.GetRuns(), s.GetCost(), orDash(s.GetCurrency()),
			s.GetPricedTokens(), s.GetWorstCaseTokens(), s.GetUnpricedTokens())
	}
	for _, r := range resp.GetRuns() {
		s := r.GetSpend()
		fmt.Fprintf(tw, "run %s\t\t%s\t%s\t%d\t%d\t%d\t\n", r.GetRunId(), s.GetCost(), orDash(s.GetCurrency()),
			s.GetPricedTokens(), s.GetWorstCaseTokens(), s.GetUnpricedTokens())
	}
	return tw.Flush()
}

const writesUsage = `
List the writes a run's subagents asked for (MCP tools and the built-in note):
each call's state, its decision if it waited for approval, and its arguments'
preview (ListToolCalls; a key with scope read): what the console's run page shows.

Usage:
  fanout writes RUN_ID [--addr HOST:PORT] [--json]

Example:
  fanout writes 6f1c2d3e-...
`

func cmdWrites(ctx context.Context, env *Env, args []string) error {
	f := newFlags("writes", writesUsage, env.Stderr)
	var cf clientFlags
	cf.register(f)
	runID, err := parseWithRunID(f, args, env)
	if err != nil {
		return fmt.Errorf("writes: %w", err)
	}
	client, closeConn, err := cf.dial()
	if err != nil {
		return err
	}
	defer closeConn()
	var calls []*fanoutv1.ToolCall
	req := &fanoutv1.ListToolCallsRequest{RunId: runID, PageSize: 200}
	for {
		resp, err := client.ListToolCalls(ctx, req)
		if err != nil {
			return err
		}
		calls = append(calls, resp.GetCalls()...)
		if resp.GetNextPageToken() == "" {
			break
		}
		req.PageToken = resp.GetNextPageToken()
	}
	if cf.json {
		printJSON(env.Stdout, &fanoutv1.ListToolCallsResponse{Calls: calls})
		return nil
	}
	if len(calls) == 0 {
		fmt.Fprintln(env.Stdout, "the run asked for no write")
		return nil
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CALL\tTASK\tATTEMPT\tTOOL\tSTATE\tDECISION\tAT\tERROR")
	for _, c := range calls {
		decision := "-"
		if d := c.GetDecision(); d != nil {
			decision = "denied by " + d.GetActor()
			if d.GetApproved() {
				decision = "approved by " + d.GetActor()
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", c.GetCallId(), c.GetTaskId(), c.GetAttempt(), c.GetTool(),
			c.GetState(), decision, c.GetCreatedAt().AsTime().Format(time.RFC3339), strings.ReplaceAll(c.GetError(), "\n", " "))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// listFlag is a flag that may be repeated; each value is appended.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }
