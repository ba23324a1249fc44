package main

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/fanout/fanout/bench/internal/fleet"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// rate is answered calls and their tokens a minute over a span.
type rate struct {
	rpm, tpm float64
	span     time.Duration
}

// between is the rate from sample a to sample b, by the mock's counters.
func between(a, b sample) rate {
	span := b.at.Sub(a.at)
	if span <= 0 {
		return rate{}
	}
	m := span.Minutes()
	return rate{rpm: float64(b.answered-a.answered) / m, tpm: float64(b.tokens-a.tokens) / m, span: span}
}

// steadyFrom and steadyTo bound the steady part of an arm: from the moment
// a tenth of its answered calls were in to the moment nine tenths were,
// leaving out the start (the first burst, nothing learned yet) and the
// tail (the last runs' stragglers, the key idle).
const steadyFrom, steadyTo = 0.1, 0.9

// steady is the rate over the steady part of samples (in time order), and
// false when it spans no time (too few calls, or samples).
func steady(samples []sample) (rate, bool) {
	if len(samples) < 2 {
		return rate{}, false
	}
	total := samples[len(samples)-1].answered - samples[0].answered
	at := func(share float64) int {
		want := samples[0].answered + int(math.Ceil(share*float64(total)))
		i, _ := slices.BinarySearchFunc(samples, want, func(s sample, w int) int { return s.answered - w })
		return min(i, len(samples)-1)
	}
	r := between(samples[at(steadyFrom)], samples[at(steadyTo)])
	return r, r.span > 0
}

// whole is the rate over the arm's wall time: every call it answered.
func whole(samples []sample, wall time.Duration) rate {
	if len(samples) < 2 || wall <= 0 {
		return rate{}
	}
	first, last := samples[0], samples[len(samples)-1]
	return between(first, sample{at: first.at.Add(wall), answered: last.answered, tokens: last.tokens})
}

// summary is what the table shows of an arm.
type summary struct {
	answered, limited, errors int
	steady                    rate
	steadyOK                  bool
	whole                     rate
	succeeded                 int
	notSucceeded              map[string]int // tasks by status, SUCCEEDED left out
	p50, p95                  time.Duration  // task latency, started to finished
	tokens                    int64          // spent by the tasks, by the ledger
	mockTokens                int64          // the answered calls' usage, by the mock
}

// calls is every call the mock received.
func (s summary) calls() int { return s.answered + s.limited + s.errors }

// limitedShare is the 429s' share of the calls, or 0 for none.
func (s summary) limitedShare() float64 {
	if s.calls() == 0 {
		return 0
	}
	return float64(s.limited) / float64(s.calls())
}

func summarize(a *arm) summary {
	s := summary{notSucceeded: map[string]int{}}
	if n := len(a.samples); n > 0 {
		first, last := a.samples[0], a.samples[n-1]
		s.answered, s.limited, s.errors = last.answered-first.answered, last.limited-first.limited, last.errors-first.errors
		s.mockTokens = last.tokens - first.tokens
	}
	s.steady, s.steadyOK = steady(a.samples)
	s.whole = whole(a.samples, a.wall)
	var lat []time.Duration
	for _, o := range a.outcomes {
		s.tokens += o.GetTokensSpent()
		if o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			s.succeeded++
		} else {
			s.notSucceeded[strings.TrimPrefix(o.GetStatus().String(), "TASK_STATUS_")]++
		}
		if o.GetStartedAt() != nil && o.GetFinishedAt() != nil {
			lat = append(lat, o.GetFinishedAt().AsTime().Sub(o.GetStartedAt().AsTime()))
		}
	}
	s.p50, s.p95 = fleet.Quantile(lat, 0.5), fleet.Quantile(lat, 0.95)
	return s
}

// ratio is a over b as "0.69x", or "-" when b is 0.
func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

// ofCeiling is a rate and its share of the ceiling: "412 (0.69)".
func ofCeiling(v float64, ceiling int64) string {
	return fmt.Sprintf("%.0f (%.2f)", v, v/float64(ceiling))
}

// printTable prints mode's arms as a table, each against the fixed arm
// (the first), then what each arm's runs ended as and chose.
func printTable(w io.Writer, c config, mode string, arms []*arm) {
	limits := "no limit flags: the limits are learned from the mock's headers, where the binary does"
	if mode == modeFlags {
		limits = fmt.Sprintf("--openai-rpm %d --openai-tpm %d on every worker", c.rpm, c.tpm)
	}
	fmt.Fprintf(w, "\n## mode %s (%s)\n\n", mode, limits)
	fmt.Fprintf(w, "%d runs of %d tasks at once, one key; each task a search, an answer and the compression call; "+
		"the mock's ceiling %d RPM / %d TPM; RPM and TPM answered by the mock, with their share of the ceiling in brackets; "+
		"steady = from %.0f%% to %.0f%% of the arm's answered calls.\n\n",
		c.runs, c.tasks, c.rpm, c.tpm, 100*steadyFrom, 100*steadyTo)
	fmt.Fprintln(w, "| arm | wall | tasks ok / not | calls answered | 429s (of calls) | RPM steady | RPM whole | TPM steady | TPM whole | task p50 / p95 | tokens: ledger / mock | wall vs fixed | steady RPM vs fixed |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	sums := make([]summary, len(arms))
	for i, a := range arms {
		sums[i] = summarize(a)
	}
	var base *summary
	var baseWall time.Duration
	if len(arms) > 0 && arms[0].fixed > 0 && arms[0].err == nil {
		base, baseWall = &sums[0], arms[0].wall
	}
	for i, a := range arms {
		s := sums[i]
		steadyRPM, steadyTPM := "-", "-"
		if s.steadyOK {
			steadyRPM, steadyTPM = ofCeiling(s.steady.rpm, c.rpm), ofCeiling(s.steady.tpm, c.tpm)
		}
		vsWall, vsRPM := "-", "-"
		if base != nil {
			vsWall = ratio(a.wall.Seconds(), baseWall.Seconds())
			if s.steadyOK && base.steadyOK {
				vsRPM = ratio(s.steady.rpm, base.steady.rpm)
			}
		}
		name := a.name()
		if a.err != nil {
			name += " (FAILED)"
		}
		fmt.Fprintf(w, "| %s | %v | %d / %d | %d | %d (%.1f%%) | %s | %s | %s | %s | %v / %v | %d / %d | %s | %s |\n",
			name, a.wall.Round(100*time.Millisecond), s.succeeded, len(a.outcomes)-s.succeeded, s.answered,
			s.limited, 100*s.limitedShare(), steadyRPM, ofCeiling(s.whole.rpm, c.rpm), steadyTPM, ofCeiling(s.whole.tpm, c.tpm),
			s.p50.Round(10*time.Millisecond), s.p95.Round(10*time.Millisecond), s.tokens, s.mockTokens, vsWall, vsRPM)
	}
	fmt.Fprintln(w)
	for i, a := range arms {
		s := sums[i]
		fmt.Fprintf(w, "- %s: runs %s; tasks not SUCCEEDED %s; answered calls / tasks SUCCEEDED %s; %d other error replies; %s\n",
			a.name(), counts(a.runs), counts(s.notSucceeded), perTask(s.answered, s.succeeded), s.errors, chosenLine(a, c.runs))
		if a.err != nil {
			fmt.Fprintf(w, "  - FAILED: %s\n", clip(a.err.Error()))
		}
	}
}

// counts is "SUCCEEDED 20, FAILED 1", by key, or "none".
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func perTask(calls, tasks int) string {
	if tasks == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(calls)/float64(tasks))
}

// chosenLine says what concurrency the arm's runs chose, from their
// chosen-concurrency events, or that they sent none.
func chosenLine(a *arm, runs int) string {
	if len(a.chosen) == 0 {
		if a.fixed > 0 {
			return fmt.Sprintf("no chosen-concurrency event (maxConcurrency %d, fixed)", a.fixed)
		}
		return "no chosen-concurrency event: the binary sends none, so the runs had the server's default maxConcurrency"
	}
	var events int
	var first, last []int64
	var kind, example string
	for _, k := range slices.Sorted(maps.Keys(a.chosen)) {
		cs := a.chosen[k]
		events += len(cs)
		kind, example = cs[0].kind, cs[0].detail
		if cs[0].hasN {
			first = append(first, cs[0].n)
		}
		if l := cs[len(cs)-1]; l.hasN {
			last = append(last, l.n)
		}
	}
	return fmt.Sprintf("%d %s events over %d of %d runs; each run's first chosen %s, last %s; e.g. %s",
		events, kind, len(a.chosen), runs, spread(first), spread(last), clip(example))
}

// spread is "min / median / max" of vs, or "-".
func spread(vs []int64) string {
	if len(vs) == 0 {
		return "-"
	}
	s := slices.Sorted(slices.Values(vs))
	return fmt.Sprintf("%d / %d / %d", s[0], s[(len(s)-1)/2], s[len(s)-1])
}

// clip shortens a long text for the report.
func clip(s string) string {
	const most = 400
	if len(s) <= most {
		return s
	}
	return fmt.Sprintf("%s… (%d bytes in all)", s[:most], len(s))
}
