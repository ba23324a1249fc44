package main

import (
	"fmt"
	"io"
	"strings"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// printQuote writes q for a person (fanout run --quote): a line per task,
// then the totals, the money and the tenant's coverage
// (docs/budget.md#quotes).
func printQuote(w io.Writer, q *fanoutv1.Quote) {
	runs := 0
	for _, t := range q.GetTasks() {
		if t.GetRuns() {
			runs++
		}
	}
	fmt.Fprintf(w, "quote (forecast from %s): %d of %d tasks run, %d admitted by the run's budget\n",
		q.GetBasis(), runs, len(q.GetTasks()), q.GetAdmittedTasks())
	width := len("synthesis")
	for _, t := range q.GetTasks() {
		width = max(width, len(t.GetTaskId()))
	}
	fmt.Fprintf(w, "  %-*s  %4s  %9s\n", width, "TASK", "RUNS", "FORECAST")
	for _, t := range q.GetTasks() {
		fmt.Fprintf(w, "  %-*s  %4s  %9d\n", width, t.GetTaskId(), yesNo(t.GetRuns()), t.GetForecastTokens())
	}
	for _, l := range []struct {
		name string
		n    int64
	}{{"tasks", q.GetTasksTokens()}, {"synthesis", q.GetSynthesisTokens()}, {"forecast", q.GetForecastTokens()},
		{"run limit", q.GetLimitTokens()}} {
		fmt.Fprintf(w, "  %-*s  %4s  %9d\n", width, l.name, "", l.n)
	}
	var money []string
	for _, c := range q.GetCost() {
		money = append(money, c.GetCurrency()+" "+c.GetCost())
	}
	if len(money) == 0 {
		fmt.Fprintln(w, "cost: the model has no price (fanout price set)")
	} else {
		fmt.Fprintf(w, "cost: %s (each token at the model's higher price)\n", strings.Join(money, ", "))
	}
	switch {
	case !q.GetTenantBudget():
		fmt.Fprintln(w, "tenant budget: none (any run is covered)")
	case q.GetTenantCovers():
		fmt.Fprintf(w, "tenant budget: %d tokens available, covers min(forecast, limit) = %d\n",
			q.GetTenantAvailableTokens(), min(q.GetForecastTokens(), q.GetLimitTokens()))
	default:
		fmt.Fprintf(w, "tenant budget: %d tokens available, does NOT cover min(forecast, limit) = %d\n",
			q.GetTenantAvailableTokens(), min(q.GetForecastTokens(), q.GetLimitTokens()))
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
