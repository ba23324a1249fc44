package orchestrator

import (
	"context"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// quoteRun prices a run of plan p before it runs (docs/budget.md#quotes),
// from the forecast admission uses: limit is the run's budget (a
// continuation's, after the addition); ended[i], when set, is how task i
// already ended (a continuation's tasks that will not run again; their
// peaks inform the forecast as a running run's do); notRun holds the lines
// of the tasks that will not run (reused or ended), with their reasons,
// filled in by the caller. Every other task runs and is forecast here.
//
// This first version forecasts each task that runs at what the forecaster
// would admit it for; the totals, the money and the tenant's coverage are
// filled in by the quote's own change.
func (e *Engine) quoteRun(_ context.Context, p *plan, limit int64, ended []*fanoutv1.TaskOutcome,
	notRun map[int]*fanoutv1.TaskQuote) (*fanoutv1.Quote, error) {
	f := newForecaster(p, limit, p.synthesisHeld)
	for i, o := range ended {
		if o != nil {
			f.ended(i, o.GetTokensSpent(), o.GetSummary().GetPeakTokens(),
				o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED ||
					o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_ITERATION_LIMIT)
		}
	}
	q := &fanoutv1.Quote{LimitTokens: limit, SynthesisTokens: p.synthesisHeld, Basis: "token_budget"}
	for i, t := range p.spec.GetTasks() {
		if line := notRun[i]; line != nil {
			line.TaskId, line.DispatchIndex, line.Runs = t.GetId(), int32(i), false
			q.Tasks = append(q.Tasks, line)
			continue
		}
		n := f.need(i)
		q.Tasks = append(q.Tasks, &fanoutv1.TaskQuote{TaskId: t.GetId(), DispatchIndex: int32(i), Runs: true,
			ForecastTokens: n})
		q.TasksTokens += n
	}
	q.ForecastTokens = q.TasksTokens + q.SynthesisTokens
	return q, nil
}
