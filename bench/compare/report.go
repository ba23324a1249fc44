package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// benchCase is one row of the report: n tasks, each making calls sim calls
// of latency in a row, all allowed at once, under a run budget of twice
// what the tasks' token_budgets add up to or (oneWave) exactly that.
type benchCase struct {
	n       int
	calls   int
	latency time.Duration
	oneWave bool
	hot     bool // the hot-tenant case (hot.go): under a tenant with a budget, fanout alone
	reps    int
}

// ideal is the case's wall time with no overhead: its calls in a row.
func (c benchCase) ideal() time.Duration { return time.Duration(c.calls) * c.latency }

// budgetPerTask is the run's budget per task.
func (c benchCase) budgetPerTask() int64 {
	if c.oneWave {
		return taskBudget
	}
	return 2 * taskBudget
}

// label names the case in the report: "N=100", "N=10, budget = sum",
// "N=1000, 3 calls of 500ms", "hot tenant, N=5000, 3 calls of 1s".
func (c benchCase) label() string {
	l := fmt.Sprintf("N=%d", c.n)
	if c.hot {
		l = "hot tenant, " + l
	}
	if c.oneWave {
		l += ", budget = sum"
	}
	switch {
	case c.calls > 1:
		l += fmt.Sprintf(", %d calls of %v", c.calls, c.latency)
	case c.hot:
		l += fmt.Sprintf(", 1 call of %v", c.latency)
	}
	return l
}

// result is what one case measured: each side's overhead over the ideal,
// one entry per repetition, and where fanout's time went.
type result struct {
	fanout, lgPG, lgNone []time.Duration
	phases               []string
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// overhead formats d as "+48 ms", or "+1.23 s" from a second on.
func overhead(d time.Duration) string {
	if d >= time.Second || d <= -time.Second {
		return fmt.Sprintf("%+.2f s", d.Seconds())
	}
	return fmt.Sprintf("%+d ms", d.Milliseconds())
}

func ratio(a, b time.Duration) string {
	if b <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1fx", float64(a)/float64(b))
}

func list(ds []time.Duration) string {
	var s []string
	for _, d := range ds {
		s = append(s, overhead(d))
	}
	return strings.Join(s, " ")
}

func printReport(w io.Writer, cfg config, versions, settings string, cases []benchCase, results []result) {
	fmt.Fprintf(w, "\nbench-compare: N tasks x one %v sim call each, all N at once; overhead = wall - %v (the ideal);\n",
		cfg.latency, cfg.latency)
	fmt.Fprintf(w, "  run budget = 2 x the tasks' token_budgets, or (budget = sum) exactly their sum;\n")
	fmt.Fprintf(w, "  \"K calls of L\": each task an agent loop of K sim calls of L in a row, a tool call between two; ideal = K x L.\n")
	fmt.Fprintf(w, "median of the reps after %s per case, both sides interleaved in the same run.\n", warmups(cfg.warmup))
	fmt.Fprintf(w, "  fanout: 1 orchestrator + %d worker processes, peer mTLS + signed dispatches, %s;\n", cfg.workers, settings)
	fmt.Fprintf(w, "          wall = Run sent -> RunFinished received (gRPC, plaintext on loopback, with an API key: --auth keys).\n")
	fmt.Fprintf(w, "  LangGraph.js: Send fan-out + reducer join, PostgresSaver on the same server (durability \"sync\"),\n")
	fmt.Fprintf(w, "          wall = graph.invoke; %s.\n\n", versions)
	header := []string{"case", "reps", "fanout overhead", "LangGraph.js overhead", "fanout/LangGraph.js"}
	if cfg.noCheckpointer {
		header = append(header, "LangGraph.js, no checkpointer")
	}
	rows := [][]string{header}
	for i, r := range results {
		row := []string{cases[i].label(), fmt.Sprint(len(r.fanout)), overhead(median(r.fanout)), overhead(median(r.lgPG)),
			ratio(median(r.fanout), median(r.lgPG))}
		if cfg.noCheckpointer {
			row = append(row, overhead(median(r.lgNone)))
		}
		rows = append(rows, row)
	}
	printTable(w, rows)
	width := 0
	for _, c := range cases {
		width = max(width, len(c.label()))
	}
	fmt.Fprintf(w, "\nevery repetition's overhead:\n")
	for i, r := range results {
		fmt.Fprintf(w, "  %-*s  fanout %s | LangGraph.js %s", width, cases[i].label(), list(r.fanout), list(r.lgPG))
		if cfg.noCheckpointer {
			fmt.Fprintf(w, " | no checkpointer %s", list(r.lgNone))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\nwhere fanout's time went (last repetition; event times recorded by PostgreSQL, from Run sent):\n")
	for i, r := range results {
		if len(r.phases) > 0 {
			fmt.Fprintf(w, "  %-*s  %s\n", width, cases[i].label(), r.phases[len(r.phases)-1])
		}
	}
}

func warmups(n int) string {
	switch n {
	case 0:
		return "no warm-up"
	case 1:
		return "one warm-up"
	}
	return fmt.Sprintf("%d warm-ups", n)
}

// printSmoke says what a -smoke run checked. It prints no timings: a smoke
// run passes when every run was accepted and every check held, however
// long they took.
func printSmoke(w io.Writer, cfg config, versions, settings string) {
	var labels []string
	for _, c := range append(cfg.cases(), cfg.hotCases()...) {
		labels = append(labels, c.label())
	}
	fmt.Fprintf(w, "bench-compare -smoke: ok: %s, one run per side each, every check held (no timings: a smoke run checks, make bench-compare measures)\n",
		strings.Join(labels, "; "))
	fmt.Fprintf(w, "  fanout, 1 orchestrator (--auth keys, called with the bench's API key) + %d workers: every run was accepted and SUCCEEDED,\n", cfg.workers)
	fmt.Fprintf(w, "          every task SUCCEEDED after as many iterations as it makes calls, one reservation per call, all settled; %s\n", settings)
	if len(cfg.hotSizes) > 0 {
		fmt.Fprintf(w, "          hot tenant: the run was under tenant %s's account, the sim logged one call per model call\n", hotTenant)
	}
	sides := "with PostgresSaver"
	if cfg.noCheckpointer {
		sides += ", and without a checkpointer"
	}
	fmt.Fprintf(w, "  LangGraph.js, %s: every run joined its N results; %s\n", sides, versions)
}

// printTable prints rows with the first column left-aligned (the case),
// the others right-aligned.
func printTable(w io.Writer, rows [][]string) {
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, c := range row {
			widths[i] = max(widths[i], len(c))
		}
	}
	for _, row := range rows {
		for i, c := range row {
			if i == 0 {
				fmt.Fprintf(w, "  %-*s", widths[i], c)
			} else {
				fmt.Fprintf(w, "  %*s", widths[i], c)
			}
		}
		fmt.Fprintln(w)
	}
}
