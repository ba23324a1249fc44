package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

const traceUsage = `
Draw a run's timeline from its persisted events, so it works for any past run: one row
per subagent on a shared time axis, its iterations as numbered segments, "+" where an
iteration ran tools, the moment the budget ran out drawn across every row ("!"), and
each row's outcome and tokens at its end.

Usage:
  fanout trace RUN_ID [--width N] [--addr HOST:PORT]

Example:
  fanout trace run_0123abcd
`

func cmdTrace(ctx context.Context, env *Env, args []string) error {
	f := newFlags("trace", traceUsage, env.Stderr)
	var cf clientFlags
	cf.register(f)
	var width int
	f.IntVar(&width, "width", 60, "columns of the time axis")
	runID, err := parseWithRunID(f, args, env)
	if err != nil {
		return err
	}
	next, closeConn, err := cf.watch(ctx, runID, 0)
	if err != nil {
		return err
	}
	defer closeConn()
	var events []*fanoutv1.RunEvent
	for {
		ev, err := next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		events = append(events, ev)
	}
	drawTimeline(env.Stdout, events, max(width, 10))
	return nil
}

// segment is one iteration of a subagent on the time axis.
type segment struct {
	end   time.Time
	iter  int32
	tools int32
}

type traceRow struct {
	id       string
	start    time.Time
	segments []segment
	end      time.Time
	status   string
	tokens   int64
	wound    bool                  // wound down: its last iteration answered without tools
	hedgedAt time.Time             // its second attempt started (TaskHedged)
	hedge    *fanoutv1.HedgeReport // how its two attempts went
}

// drawTimeline renders events of one run as rows on a shared time axis.
func drawTimeline(w io.Writer, events []*fanoutv1.RunEvent, width int) {
	if len(events) == 0 {
		fmt.Fprintln(w, "no events")
		return
	}
	var order []string
	rows := map[string]*traceRow{}
	row := func(id string) *traceRow {
		r, ok := rows[id]
		if !ok {
			r = &traceRow{id: id, status: "PENDING"}
			rows[id] = r
			order = append(order, id)
		}
		return r
	}
	t0 := events[0].GetTime().AsTime()
	t1 := events[len(events)-1].GetTime().AsTime()
	// The moment the budget ran out: the run's one BudgetExhausted, which
	// the engine appends whatever the path (docs/budget.md, "When the
	// budget ran out"); the console's timeline reads the same.
	var exhaustedAt time.Time
	var runID, final string
	var sizes []string // the run's ConcurrencyChosen, in order
	for _, ev := range events {
		at := ev.GetTime().AsTime()
		runID = ev.GetRunId()
		switch e := ev.GetEvent().(type) {
		case *fanoutv1.RunEvent_RunStarted:
			for _, t := range e.RunStarted.GetRun().GetSpec().GetTasks() {
				row(t.GetId())
			}
		case *fanoutv1.RunEvent_TaskStarted:
			row(e.TaskStarted.GetTaskId()).start = at
		case *fanoutv1.RunEvent_TaskIteration:
			r := row(e.TaskIteration.GetTaskId())
			r.segments = append(r.segments, segment{end: at, iter: e.TaskIteration.GetIteration(), tools: e.TaskIteration.GetToolCalls()})
			r.tokens = e.TaskIteration.GetTokensSpent()
		case *fanoutv1.RunEvent_TaskFinished:
			o := e.TaskFinished.GetOutcome()
			r := row(o.GetTaskId())
			r.end, r.status, r.tokens = at, runs.Text(o.GetStatus()), o.GetTokensSpent()
			r.wound = o.GetSummary().GetWoundDown()
			r.hedge = o.GetHedge()
		case *fanoutv1.RunEvent_TaskHedged:
			row(e.TaskHedged.GetTaskId()).hedgedAt = at
		case *fanoutv1.RunEvent_BudgetExhausted:
			exhaustedAt = at
		case *fanoutv1.RunEvent_ConcurrencyChosen:
			c := e.ConcurrencyChosen
			sizes = append(sizes, fmt.Sprintf("concurrency %d at +%s: %s", c.GetConcurrency(),
				at.Sub(t0).Round(time.Millisecond), c.GetReason()))
		case *fanoutv1.RunEvent_RunFinished:
			final = runs.Text(e.RunFinished.GetState())
			if c := e.RunFinished.GetCancelCause(); c != "" {
				final += " (" + c + ")"
			}
		}
	}
	span := t1.Sub(t0)
	if span <= 0 {
		span = time.Millisecond
	}
	col := func(t time.Time) int {
		c := int(int64(width-1) * int64(t.Sub(t0)) / int64(span))
		return min(max(c, 0), width-1)
	}
	exCol := -1
	if !exhaustedAt.IsZero() {
		exCol = col(exhaustedAt)
	}
	nameW := 8
	for _, id := range order {
		nameW = max(nameW, len(id))
	}
	fmt.Fprintf(w, "run %s  %s  %s\n", runID, span.Round(time.Millisecond), final)
	axis := []rune(strings.Repeat("-", width))
	if exCol >= 0 {
		axis[exCol] = 'v'
	}
	fmt.Fprintf(w, "%-*s |%s| %s\n", nameW, "", string(axis), "budget exhausted at v")
	for _, id := range order {
		r := rows[id]
		line := []rune(strings.Repeat(" ", width))
		if !r.start.IsZero() {
			from := col(r.start)
			for _, s := range r.segments {
				to := col(s.end)
				for c := from; c <= to; c++ {
					line[c] = rune('0' + s.iter%10)
				}
				if s.tools > 0 {
					line[to] = '+'
				}
				from = min(to+1, width-1)
			}
			if !r.end.IsZero() && (len(r.segments) == 0 || r.end.After(r.segments[len(r.segments)-1].end)) {
				// Work after the last finished iteration: cut short, or the summary.
				for c := from; c <= col(r.end); c++ {
					if line[c] == ' ' {
						line[c] = '~'
					}
				}
			}
		}
		if r.wound && len(r.segments) > 0 {
			line[col(r.segments[len(r.segments)-1].end)] = 'w'
		}
		if r.start.IsZero() && r.status == "NOT_STARTED" && !r.end.IsZero() {
			line[col(r.end)] = 'x'
		}
		if !r.hedgedAt.IsZero() {
			line[col(r.hedgedAt)] = 'h'
		}
		if exCol >= 0 {
			line[exCol] = '!'
		}
		note := ""
		if h := hedgeNote(r.hedge); h != "" {
			note = "  (" + h + ")"
		}
		fmt.Fprintf(w, "%-*s |%s| %-17s %7d tokens%s\n", nameW, id, string(line), r.status, r.tokens, note)
	}
	fmt.Fprintf(w, "%-*s  0%s%s\n", nameW, "", strings.Repeat(" ", max(width-len(span.Round(time.Millisecond).String())-1, 1)), span.Round(time.Millisecond))
	fmt.Fprintf(w, "%-*s  digits: iteration number; +: the iteration ran tools; ~: cut short or summarising; !: budget exhausted\n", nameW, "")
	fmt.Fprintf(w, "%-*s  w: wound down (its last iteration answered without tools); x: not started (the run could not afford it); h: hedged (a second attempt started)\n", nameW, "")
	for _, s := range sizes {
		fmt.Fprintln(w, s)
	}
}
