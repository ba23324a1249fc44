package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// result is what one task count measured: each side's overhead over the
// ideal, one entry per repetition, and where fanout's time went.
type result struct {
	n                    int
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

func printReport(w io.Writer, cfg config, versions, settings string, results []result) {
	fmt.Fprintf(w, "\nbench-compare: N tasks x one %v sim call each, all N at once; overhead = wall - %v (the ideal);\n",
		cfg.latency, cfg.latency)
	fmt.Fprintf(w, "median of the reps after %s per N, both sides interleaved in the same run.\n", warmups(cfg.warmup))
	fmt.Fprintf(w, "  fanout: 1 orchestrator + %d worker processes, peer mTLS + signed dispatches, %s;\n", cfg.workers, settings)
	fmt.Fprintf(w, "          wall = Run sent -> RunFinished received (gRPC, plaintext on loopback, with an API key: --auth keys).\n")
	fmt.Fprintf(w, "  LangGraph.js: Send fan-out + reducer join, PostgresSaver on the same server (durability \"sync\"),\n")
	fmt.Fprintf(w, "          wall = graph.invoke; %s.\n\n", versions)
	header := []string{"N", "reps", "fanout overhead", "LangGraph.js overhead", "fanout/LangGraph.js"}
	if cfg.noCheckpointer {
		header = append(header, "LangGraph.js, no checkpointer")
	}
	rows := [][]string{header}
	for _, r := range results {
		row := []string{fmt.Sprint(r.n), fmt.Sprint(len(r.fanout)), overhead(median(r.fanout)), overhead(median(r.lgPG)),
			ratio(median(r.fanout), median(r.lgPG))}
		if cfg.noCheckpointer {
			row = append(row, overhead(median(r.lgNone)))
		}
		rows = append(rows, row)
	}
	printTable(w, rows)
	fmt.Fprintf(w, "\nevery repetition's overhead:\n")
	for _, r := range results {
		fmt.Fprintf(w, "  N=%-5d fanout %s | LangGraph.js %s", r.n, list(r.fanout), list(r.lgPG))
		if cfg.noCheckpointer {
			fmt.Fprintf(w, " | no checkpointer %s", list(r.lgNone))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\nwhere fanout's time went (last repetition; event times recorded by PostgreSQL, from Run sent):\n")
	for _, r := range results {
		if len(r.phases) > 0 {
			fmt.Fprintf(w, "  N=%-5d %s\n", r.n, r.phases[len(r.phases)-1])
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
	fmt.Fprintf(w, "bench-compare -smoke: ok: N=%d, one run per side, every check held (no timings: a smoke run checks, make bench-compare measures)\n", smokeN)
	fmt.Fprintf(w, "  fanout, 1 orchestrator (--auth keys, called with the bench's API key) + %d workers: the run was accepted and SUCCEEDED,\n", cfg.workers)
	fmt.Fprintf(w, "          all %d tasks SUCCEEDED after 1 iteration, %d reservations, all settled; %s\n", smokeN, smokeN, settings)
	sides := "with PostgresSaver"
	if cfg.noCheckpointer {
		sides += ", and without a checkpointer"
	}
	fmt.Fprintf(w, "  LangGraph.js, %s: %d results joined; %s\n", sides, smokeN, versions)
}

// printTable prints rows with right-aligned columns.
func printTable(w io.Writer, rows [][]string) {
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, c := range row {
			widths[i] = max(widths[i], len(c))
		}
	}
	for _, row := range rows {
		for i, c := range row {
			fmt.Fprintf(w, "  %*s", widths[i], c)
		}
		fmt.Fprintln(w)
	}
}
