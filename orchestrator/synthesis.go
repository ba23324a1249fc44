package orchestrator

import (
	"context"
	"errors"
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
	// A run whose tasks the budget stopped still has what it held back for
	// its synthesis: it ends with an answer. Any other stop (a cancel, a
	// timeout) skips it.
	if runCause != nil && (acct.Held == 0 || !errors.Is(runCause, budget.ErrExhausted)) {
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

// synthesisPay is what pays for a run's synthesis on its account acct, and
// whether it is what the run held back for it: that, once the run is
// exhausted or when it is the larger; else what is still available (a run
// that finished its tasks within budget gives its synthesis all that is
// left, and releases the allowance at its close) less the run's
// min_reservation: a grant that took the run below it would exhaust the
// run, and under EXHAUSTION_POLICY_CANCEL cut off the synthesis itself.
func synthesisPay(acct budget.Account) (pay int64, fromHeld bool) {
	room := max(0, acct.Available()-acct.MinReservation)
	if acct.Held > 0 && (acct.State == budget.StateExhausted || acct.Held >= room) {
		return acct.Held, true
	}
	return room, false
}

// synthesisRequest is the dispatch of a run's synthesis, paid from the run
// account acct (synthesisPay). It is given the joined facts, as many as fit
// in what pays for it (fitFacts); the instruction says how many were left
// out.
func (d *driver) synthesisRequest(acct budget.Account, result *fanoutv1.JoinedResult) *fanoutv1.Dispatch {
	pay, fromHeld := synthesisPay(acct)
	instruction := synthesisInstruction + taskReport(result.GetTasks())
	out := int64(defaultSynthesisOutput)
	if n := d.p.spec.GetModel().GetMaxOutputTokens(); n > 0 {
		out = int64(n)
	}
	room := pay - min(out, pay/2) - int64(len(instruction)+len(d.p.spec.GetGoal())) - synthesisPromptBytes - leftOutNoteBytes
	facts, left := fitFacts(result.GetFacts(), room)
	if left > 0 {
		instruction += fmt.Sprintf("\n\n%d of the %d facts found were left out: the synthesis's budget pays for "+
			"the first %d, in the order the tasks were dispatched. Say that the answer rests on part of what was found.",
			left, len(result.GetFacts()), len(facts))
	}
	return &fanoutv1.Dispatch{
		RunId:    d.runID,
		TenantId: d.p.tenantID,
		Task: &fanoutv1.TaskSpec{
			Id:            synthesisTaskID,
			Instruction:   instruction,
			TokenBudget:   pay,
			MaxIterations: 1,
			Timeout:       durationpb.New(d.e.cfg.DefaultTaskTimeout),
		},
		Goal:                 d.p.spec.GetGoal(),
		TaskAccountId:        int64(acct.ID),
		MinReservationTokens: d.p.minReservation,
		Model:                d.p.spec.GetModel(),
		OnExhaustion:         d.p.spec.GetOnExhaustion(),
		ContextFacts:         facts,
		DrawOnHeld:           fromHeld,
	}
}

// synthesisPromptBytes bounds what the worker adds to the synthesis call's
// input besides the instruction, the goal and the facts (its system prompt
// and message framing); the worker's input bound counts a token per byte.
const synthesisPromptBytes = 512

// leftOutNoteBytes bounds the note that says how many facts were left out.
const leftOutNoteBytes = 256

// fitFacts returns the facts, in order, whose lines in the worker's prompt
// ("- text [source, ...]") fit in room bytes, and how many were left out.
func fitFacts(facts []*fanoutv1.Fact, room int64) (kept []*fanoutv1.Fact, left int) {
	for i, f := range facts {
		n := int64(len(f.GetText()) + 6)
		for _, s := range f.GetSources() {
			n += int64(len(s) + 2)
		}
		if n > room {
			return facts[:i], len(facts) - i
		}
		room -= n
	}
	return facts, 0
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
	var notStarted []string
	for _, t := range tasks {
		if t.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED {
			notStarted = append(notStarted, t.GetTaskId()) // one line for all: their reasons say the same
			continue
		}
		fmt.Fprintf(&b, "\n- %s: %s", t.GetTaskId(), runs.Text(t.GetStatus()))
		if t.GetSummary().GetWoundDown() {
			b.WriteString(" (wound down: it answered early, without tools, for want of budget)")
		}
		if e := t.GetSummary().GetError(); e != "" && t.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			if len(e) > reportErrorBytes {
				e = strings.ToValidUTF8(e[:reportErrorBytes], "") + "…"
			}
			fmt.Fprintf(&b, ": %s", e)
		}
	}
	if len(notStarted) > 0 {
		fmt.Fprintf(&b, "\n- not started, for want of budget (they found nothing): %s", strings.Join(notStarted, ", "))
	}
	return b.String()
}

// reportErrorBytes caps each task's error in the synthesis call's report.
const reportErrorBytes = 300

// synthesisUnaffordable says why the run account acct cannot pay for
// synthesis, or "" when it can: from what it holds back for it (also once
// the run is exhausted), else from what is available.
func (d *driver) synthesisUnaffordable(acct budget.Account) string {
	switch {
	case acct.Held > 0 && acct.State != budget.StateOpen && acct.State != budget.StateExhausted:
		return "the run's budget was " + string(acct.State)
	case acct.Held > 0:
		if pay, _ := synthesisPay(acct); pay < d.p.minReservation {
			return fmt.Sprintf("the run holds %d tokens for its synthesis and %d are available, less than its minimum reservation %d",
				acct.Held, acct.Available(), d.p.minReservation)
		}
		return ""
	case acct.State == budget.StateExhausted:
		return "the run's budget was exhausted: the ledger grants it nothing more"
	case acct.State != budget.StateOpen:
		return "the run's budget was " + string(acct.State)
	case acct.Available() < d.p.minReservation:
		return fmt.Sprintf("%d tokens available, synthesis needs at least %d", acct.Available(), d.p.minReservation)
	}
	return ""
}
