package orchestrator

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// synthesisTaskID names the synthesis call on the worker and in the ledger
// (validation keeps task ids from starting with "_", so it is never a task's).
const synthesisTaskID = "_synthesis"

// synthesisInstruction is what the synthesis subagent is asked.
const synthesisInstruction = "Synthesize the facts given above into one answer to the goal. " +
	"Keep every claim tied to its sources; say what the facts do not settle."

// synthesize runs the one synthesis call of a run whose tasks all ended
// without a cancel cause: a single-iteration subagent on a worker, paid
// from the run account itself (so from the same budget), given the joined
// facts, and dispatched like a task (dispatch.go) but recording no task
// progress. It returns the synthesis, or why it was skipped. It never
// fails the run: the facts stand without it. Its deadline is its own
// (DefaultTaskTimeout), detached from the run's cancellation.
func (d *driver) synthesize(runCtx context.Context, runCause error, result *fanoutv1.JoinedResult) (text, skipped string) {
	ctx, cancel := context.WithTimeoutCause(context.WithoutCancel(runCtx), d.e.cfg.DefaultTaskTimeout, errTaskTimeout)
	defer cancel()
	ctx, abandon := context.WithCancelCause(ctx)
	defer abandon(nil)
	go func() { // another replica adopted the run: its synthesis is theirs
		select {
		case <-d.ar.lostCh:
			abandon(errRunLost)
		case <-ctx.Done():
		}
	}()
	acct, err := d.e.ledger.RunAccount(ctx, d.runID)
	if err != nil {
		return "", "the run's budget could not be read"
	}
	if reason := d.synthesisUnaffordable(acct); reason != "" {
		return "", reason
	}
	if runCause != nil {
		return "", "the run did not finish its tasks: " + runCause.Error()
	}
	if len(result.GetFacts()) == 0 {
		return "", "no facts to synthesize"
	}
	o := d.newDispatch(d.e.workers.Next(), d.synthesisRequest(acct, result), noProgress{}).run(ctx)
	sum := o.GetSummary()
	var b strings.Builder
	for _, f := range sum.GetFacts() {
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(f.GetText())
		if len(f.GetSources()) > 0 {
			fmt.Fprintf(&b, " [%s]", strings.Join(f.GetSources(), ", "))
		}
	}
	switch {
	case b.Len() > 0:
		result.TotalTokens += sum.GetTokensSpent()
		return b.String(), ""
	case sum == nil:
		return "", fmt.Sprintf("the synthesis call ended %s before it answered", runs.Text(o.GetStatus()))
	case o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_FAILED:
		d.e.cfg.Logger.WarnContext(ctx, "synthesis call", "run_id", d.runID, "err", sum.GetError())
		return "", "the synthesis call failed: " + sum.GetError()
	}
	return "", fmt.Sprintf("the synthesis call ended %s without an answer: %s", runs.Text(sum.GetStatus()), sum.GetError())
}

// synthesisRequest is the dispatch of a run's synthesis: paid from the run
// account acct, given the joined facts.
func (d *driver) synthesisRequest(acct budget.Account, result *fanoutv1.JoinedResult) *fanoutv1.Dispatch {
	return &fanoutv1.Dispatch{
		RunId:    d.runID,
		TenantId: d.p.tenantID,
		Task: &fanoutv1.TaskSpec{
			Id:            synthesisTaskID,
			Instruction:   synthesisInstruction + taskReport(result.GetTasks()),
			TokenBudget:   acct.Available(),
			MaxIterations: 1,
			Timeout:       durationpb.New(d.e.cfg.DefaultTaskTimeout),
		},
		Goal:                 d.p.spec.GetGoal(),
		TaskAccountId:        int64(acct.ID),
		MinReservationTokens: d.p.minReservation,
		Model:                d.p.spec.GetModel(),
		OnExhaustion:         d.p.spec.GetOnExhaustion(),
		ContextFacts:         result.GetFacts(),
	}
}

// taskReport tells the synthesis call how every task ended, so that it
// can say what a failed, timed-out or cancelled task leaves unsettled
// instead of presenting the facts of the others as the whole answer.
// Each error is cut at reportErrorBytes.
func taskReport(tasks []*fanoutv1.TaskOutcome) string {
	if len(tasks) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n\nHow the tasks ended (facts come only from those that found some):")
	for _, t := range tasks {
		fmt.Fprintf(&b, "\n- %s: %s", t.GetTaskId(), runs.Text(t.GetStatus()))
		if e := t.GetSummary().GetError(); e != "" && t.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			if len(e) > reportErrorBytes {
				e = strings.ToValidUTF8(e[:reportErrorBytes], "") + "…"
			}
			fmt.Fprintf(&b, ": %s", e)
		}
	}
	return b.String()
}

// reportErrorBytes caps each task's error in the synthesis call's report.
const reportErrorBytes = 300

// synthesisUnaffordable says why the run account acct cannot pay for
// synthesis, or "" when it can.
func (d *driver) synthesisUnaffordable(acct budget.Account) string {
	switch {
	case acct.State == budget.StateExhausted:
		return "the run's budget was exhausted: the ledger grants it nothing more"
	case acct.State != budget.StateOpen:
		return "the run's budget was " + string(acct.State)
	case acct.Available() < d.p.minReservation:
		return fmt.Sprintf("%d tokens available, synthesis needs at least %d", acct.Available(), d.p.minReservation)
	}
	return ""
}
