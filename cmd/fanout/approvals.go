package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

const approvalsUsage = `
List, approve or deny the writes that wait for a person's approval (a key
with scope approve; docs/mcp.md "Approvals"). Each call has its own id:
approving one approves exactly that call.

Usage:
  fanout approvals list [--run RUN_ID] [--addr HOST:PORT] [--json]
  fanout approvals approve CALL_ID [--reason TEXT] [--addr HOST:PORT] [--json]
  fanout approvals deny CALL_ID [--reason TEXT] [--addr HOST:PORT] [--json]

Example:
  fanout approvals list
  fanout approvals approve tc_3f2a9c0d1e4b5a6978c0d1e2f3a4b5c6 --reason "checked the amount"
`

func cmdApprovals(ctx context.Context, env *Env, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprint(env.Stderr, strings.TrimPrefix(approvalsUsage, "\n"))
		return errors.New("approvals: need a subcommand: list, approve or deny")
	}
	sub, rest := args[0], args[1:]
	f := newFlags("approvals "+sub, approvalsUsage, env.Stderr)
	var cf clientFlags
	cf.register(f)
	switch sub {
	case "list":
		var runID string
		f.StringVar(&runID, "run", "", "only this run's calls")
		if err := parseFlags(f, rest, env); err != nil {
			return err
		}
		return listApprovals(ctx, env, cf, runID)
	case "approve", "deny":
		var reason string
		f.StringVar(&reason, "reason", "", "why (at most 1024 bytes); logged, and for a denial told to the model")
		callID, err := parseWithRunID(f, rest, env)
		if err != nil {
			return fmt.Errorf("approvals %s: %w (want a CALL_ID from fanout approvals list)", sub, err)
		}
		return decideApproval(ctx, env, cf, sub == "approve", callID, reason)
	}
	fmt.Fprint(env.Stderr, strings.TrimPrefix(approvalsUsage, "\n"))
	return fmt.Errorf("approvals: unknown subcommand %q: want list, approve or deny", sub)
}

func listApprovals(ctx context.Context, env *Env, cf clientFlags, runID string) error {
	client, closeConn, err := cf.dial()
	if err != nil {
		return err
	}
	defer closeConn()
	var calls []*fanoutv1.PendingToolCall
	req := &fanoutv1.ListApprovalsRequest{RunId: runID}
	for {
		resp, err := client.ListApprovals(ctx, req)
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
		printJSON(env.Stdout, &fanoutv1.ListApprovalsResponse{Calls: calls})
		return nil
	}
	if len(calls) == 0 {
		fmt.Fprintln(env.Stdout, "no write waits for approval")
		return nil
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CALL\tRUN\tTASK\tTOOL\tEXPIRES IN\tARGUMENTS")
	for _, c := range calls {
		left := time.Until(c.GetDeadline().AsTime()).Round(time.Second)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", c.GetCallId(), c.GetRunId(), c.GetTaskId(), c.GetTool(), max(left, 0),
			c.GetPreview())
	}
	return tw.Flush()
}

func decideApproval(ctx context.Context, env *Env, cf clientFlags, approve bool, callID, reason string) error {
	client, closeConn, err := cf.dial()
	if err != nil {
		return err
	}
	defer closeConn()
	var d *fanoutv1.ToolCallDecision
	if approve {
		resp, err := client.ApproveToolCall(ctx, &fanoutv1.ApproveToolCallRequest{CallId: callID, Reason: reason})
		if err != nil {
			return err
		}
		d = resp.GetDecision()
	} else {
		resp, err := client.DenyToolCall(ctx, &fanoutv1.DenyToolCallRequest{CallId: callID, Reason: reason})
		if err != nil {
			return err
		}
		d = resp.GetDecision()
	}
	if cf.json {
		printJSON(env.Stdout, d)
		return nil
	}
	verb := "denied"
	if d.GetApproved() {
		verb = "approved"
	}
	fmt.Fprintf(env.Stdout, "%s: %s by %s at %s (%s of task %s of run %s)\n", d.GetCallId(), verb, d.GetActor(),
		d.GetDecidedAt().AsTime().Format(time.RFC3339), d.GetTool(), d.GetTaskId(), d.GetRunId())
	return nil
}
