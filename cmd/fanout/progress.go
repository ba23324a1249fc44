package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// progress draws a run's live state: one line per subagent (status,
// iteration, tokens) and a budget bar. On a terminal the block is redrawn in
// place; otherwise each change is printed as a plain line.
type progress struct {
	w      io.Writer
	tty    bool
	order  []string
	tasks  map[string]*taskLine
	budget *fanoutv1.BudgetSnapshot
	runID  string
	drawn  int // lines of the block on screen
	notes  []string
}

type taskLine struct {
	status    string
	iteration int32
	tokens    int64
	worker    string
}

func newProgress(w io.Writer) *progress {
	tty := false
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			tty = os.Getenv("TERM") != "dumb"
		}
	}
	return &progress{w: w, tty: tty, tasks: map[string]*taskLine{}}
}

func (p *progress) task(id string) *taskLine {
	t, ok := p.tasks[id]
	if !ok {
		t = &taskLine{status: "PENDING"}
		p.tasks[id] = t
		p.order = append(p.order, id)
	}
	return t
}

// apply takes one event and shows it.
func (p *progress) apply(ev *fanoutv1.RunEvent) {
	p.runID = ev.GetRunId()
	var line string
	switch e := ev.GetEvent().(type) {
	case *fanoutv1.RunEvent_RunStarted:
		r := e.RunStarted.GetRun()
		p.budget = r.GetBudget()
		for _, t := range r.GetSpec().GetTasks() {
			p.task(t.GetId())
		}
		// A large run's spec is served cut (Run.spec_cut): task_count counts them all.
		line = fmt.Sprintf("run %s started: %d tasks, budget %d tokens", r.GetRunId(), max(int(r.GetTaskCount()), len(r.GetSpec().GetTasks())),
			r.GetSpec().GetBudget().GetLimitTokens())
		if h := r.GetBudget().GetHeldTokens(); h > 0 {
			line += fmt.Sprintf(", %d of them held for the synthesis", h)
		}
	case *fanoutv1.RunEvent_TaskQueued:
		p.task(e.TaskQueued.GetTaskId()).status = "QUEUED"
	case *fanoutv1.RunEvent_TaskStarted:
		t := p.task(e.TaskStarted.GetTaskId())
		t.status, t.worker = "RUNNING", e.TaskStarted.GetWorker()
		line = fmt.Sprintf("%-16s started on %s", e.TaskStarted.GetTaskId(), t.worker)
		if f := e.TaskStarted.GetForecastTokens(); f > 0 {
			line += fmt.Sprintf(", forecast to need %d tokens", f)
		}
	case *fanoutv1.RunEvent_TaskIteration:
		t := p.task(e.TaskIteration.GetTaskId())
		t.iteration, t.tokens = e.TaskIteration.GetIteration(), e.TaskIteration.GetTokensSpent()
		line = fmt.Sprintf("%-16s iteration %d, %d tokens", e.TaskIteration.GetTaskId(), t.iteration, t.tokens)
	case *fanoutv1.RunEvent_TaskFinished:
		o := e.TaskFinished.GetOutcome()
		t := p.task(o.GetTaskId())
		t.status, t.tokens = runs.Text(o.GetStatus()), o.GetTokensSpent()
		if n := o.GetSummary().GetIterations(); n > 0 {
			t.iteration = n
		}
		line = fmt.Sprintf("%-16s %s after %d iterations, %d tokens", o.GetTaskId(), t.status, t.iteration, t.tokens)
		switch {
		case o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_NOT_STARTED:
			line = fmt.Sprintf("%-16s %s (%s)", o.GetTaskId(), t.status, o.GetSummary().GetError())
		case o.GetSummary().GetWoundDown():
			line += " (wound down: its last iteration answered without tools)"
		}
		if h := hedgeNote(o.GetHedge()); h != "" {
			line += " (" + h + ")"
		}
	case *fanoutv1.RunEvent_ChildRunStarted:
		c := e.ChildRunStarted
		line = fmt.Sprintf("%-16s fanned out: child run %s, %d tasks, %d tokens carved from the task (depth %d)",
			c.GetTaskId(), c.GetChildRunId(), c.GetTaskCount(), c.GetLimitTokens(), c.GetDepth())
	case *fanoutv1.RunEvent_ChildRunFinished:
		c := e.ChildRunFinished
		line = fmt.Sprintf("%-16s child run %s %s: %d tokens, %d facts back to the task", c.GetTaskId(), c.GetChildRunId(),
			runs.Text(c.GetState()), c.GetSpentTokens(), c.GetFactCount())
	case *fanoutv1.RunEvent_TaskHedged:
		h := e.TaskHedged
		line = fmt.Sprintf("%-16s hedged: a second attempt on %s after %s (threshold %s: %s)", h.GetTaskId(), h.GetWorker(),
			h.GetAfter().AsDuration().Round(time.Millisecond), h.GetThreshold().AsDuration().Round(time.Millisecond), h.GetReason())
		p.task(h.GetTaskId()).status = "RUNNING, HEDGED"
	case *fanoutv1.RunEvent_BudgetUpdate:
		p.budget = e.BudgetUpdate.GetBudget()
	case *fanoutv1.RunEvent_BudgetExhausted:
		p.budget = e.BudgetExhausted.GetBudget()
		line = "BUDGET EXHAUSTED: the ledger can grant no more; cancelling every running subagent"
		p.notes = append(p.notes, line)
	case *fanoutv1.RunEvent_RunFinished:
		line = fmt.Sprintf("run finished: %s %s", runs.Text(e.RunFinished.GetState()), e.RunFinished.GetCancelCause())
		p.notes = append(p.notes, line)
	case *fanoutv1.RunEvent_RunContinued:
		c := e.RunContinued
		line = fmt.Sprintf("run continued (#%d by %s): +%d tokens, budget now %d", c.GetContinuation(), c.GetActor(),
			c.GetAddedTokens(), c.GetLimitTokens())
		if c.GetReopened() {
			line += fmt.Sprintf("; reopened for %d tasks", len(c.GetTaskIds()))
			for _, id := range c.GetTaskIds() {
				p.task(id).status = "PENDING"
			}
		}
		p.notes = append(p.notes, line)
	}
	if p.tty {
		p.redraw()
	} else if line != "" {
		fmt.Fprintln(p.w, line)
	}
}

// finish leaves the last drawing on screen.
func (p *progress) finish() {
	if p.tty {
		p.redraw()
	} else if p.budget != nil {
		fmt.Fprintln(p.w, budgetBar(p.budget, 40))
	}
}

func (p *progress) redraw() {
	var b strings.Builder
	if p.drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", p.drawn) // back to the top of the block
	}
	lines := make([]string, 0, len(p.order)+4)
	lines = append(lines, fmt.Sprintf("run %s", p.runID))
	for _, id := range p.order {
		t := p.tasks[id]
		lines = append(lines, fmt.Sprintf("  %-16s %-17s iter %2d  %7d tokens  %s", id, t.status, t.iteration, t.tokens, t.worker))
	}
	if p.budget != nil {
		lines = append(lines, budgetBar(p.budget, 40))
	}
	lines = append(lines, p.notes...)
	for _, l := range lines {
		b.WriteString("\x1b[2K") // clear the line
		b.WriteString(l)
		b.WriteByte('\n')
	}
	p.drawn = len(lines)
	io.WriteString(p.w, b.String()) //nolint:errcheck // a terminal that stopped reading has no one to tell
}

// budgetBar draws spent (#) and reserved (=) against the limit.
func budgetBar(s *fanoutv1.BudgetSnapshot, width int) string {
	limit := max(s.GetLimitTokens(), 1)
	spent := int(int64(width) * s.GetSpentTokens() / limit)
	reserved := min(int(int64(width)*s.GetReservedTokens()/limit), width-spent)
	bar := strings.Repeat("#", spent) + strings.Repeat("=", reserved) + strings.Repeat(".", max(width-spent-reserved, 0))
	state := ""
	if s.GetExhausted() {
		state = "  EXHAUSTED"
	}
	return fmt.Sprintf("  budget [%s] %d spent + %d reserved of %d%s", bar, s.GetSpentTokens(), s.GetReservedTokens(), s.GetLimitTokens(), state)
}

// hedgeNote says how a hedged task's two attempts went (TaskOutcome.hedge),
// "" for a task that was not hedged.
func hedgeNote(h *fanoutv1.HedgeReport) string {
	if h == nil {
		return ""
	}
	var won string
	switch h.GetWinner() {
	case fanoutv1.HedgeAttempt_HEDGE_ATTEMPT_HEDGE:
		won = "the hedge won"
	case fanoutv1.HedgeAttempt_HEDGE_ATTEMPT_FIRST:
		won = "the first attempt won"
	default:
		won = "neither attempt answered"
	}
	return fmt.Sprintf("hedged after %s: %s; first %d + hedge %d tokens", h.GetStartedAfter().AsDuration().Round(time.Millisecond),
		won, h.GetFirstTokens(), h.GetHedgeTokens())
}
