package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanout/fanout/subagent/llm"
)

func TestSmokeIsOneRunOfTenPerSide(t *testing.T) {
	c, err := parseConfig([]string{"-smoke"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.sizes, []int{smokeN}) || !slices.Equal(c.reps, []int{1}) || c.warmup != 0 || c.total != 3*time.Minute {
		t.Errorf("-smoke: sizes %v, reps %v, warmup %d, timeout %v; want [%d] [1] 0 3m", c.sizes, c.reps, c.warmup, c.total, smokeN)
	}
	// Every case once at N=10, the agent loop with its calls and latency.
	var got []string
	for _, bc := range c.cases() {
		got = append(got, fmt.Sprintf("%s x%d, ideal %v", bc.label(), bc.reps, bc.ideal()))
	}
	if want := []string{"N=10 x1, ideal 700ms", "N=10, budget = sum x1, ideal 700ms", "N=10, 3 calls of 500ms x1, ideal 1.5s"}; !slices.Equal(got, want) {
		t.Errorf("-smoke's cases: %q, want %q", got, want)
	}
	if hot := c.hotCases(); len(hot) != 1 || hot[0].label() != "hot tenant, N=10, 3 calls of 1s" || hot[0].reps != 1 {
		t.Errorf("-smoke's hot-tenant case: %+v, want N=10 once", hot)
	}
	if c, err := parseConfig([]string{"-smoke", "-timeout", "1m"}); err != nil || c.total != time.Minute {
		t.Errorf("-smoke -timeout 1m: %v, %v", c.total, err)
	}
	for _, flag := range []string{"-n", "-reps", "-warmup", "-one-wave", "-one-wave-reps", "-loop-n", "-loop-reps", "-hot", "-hot-reps"} {
		if _, err := parseConfig([]string{"-smoke", flag, "1"}); err == nil || !strings.Contains(err.Error(), "-smoke") {
			t.Errorf("-smoke %s 1: %v, want an error naming -smoke", flag, err)
		}
	}
}

func TestDefaultsMeasureAfterOneWarmUp(t *testing.T) {
	c, err := parseConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.smoke || !slices.Equal(c.sizes, []int{10, 100, 1000}) || !slices.Equal(c.reps, []int{5, 5, 5}) || c.warmup != 1 {
		t.Errorf("defaults: smoke %v, sizes %v, reps %v, warmup %d", c.smoke, c.sizes, c.reps, c.warmup)
	}
	if !slices.Equal(c.oneWave, []int{10, 100}) || !slices.Equal(c.oneWaveReps, []int{5, 5}) ||
		!slices.Equal(c.loopSizes, []int{1000}) || !slices.Equal(c.loopReps, []int{5}) || c.loopCalls != 3 || c.loopLatency != 500*time.Millisecond {
		t.Errorf("defaults: one wave %v x %v, agent loop %v x %v of %d calls of %v", c.oneWave, c.oneWaveReps,
			c.loopSizes, c.loopReps, c.loopCalls, c.loopLatency)
	}
	if !slices.Equal(c.hotSizes, []int{defaultHotN}) || !slices.Equal(c.hotReps, []int{3}) || c.hotCalls != 3 || c.hotLatency != time.Second {
		t.Errorf("defaults: hot tenant %v x %v of %d calls of %v", c.hotSizes, c.hotReps, c.hotCalls, c.hotLatency)
	}
	if _, err := parseConfig([]string{"-warmup", "-1"}); err == nil {
		t.Error("-warmup -1 accepted")
	}
	if _, err := parseConfig([]string{"-one-wave", "10,100", "-one-wave-reps", "5"}); err == nil {
		t.Error("-one-wave of 2 sizes with 1 repetition count accepted")
	}
	if _, err := parseConfig([]string{"-loop-calls", "1"}); err == nil {
		t.Error("-loop-calls 1 accepted")
	}
}

// TestCasesMayBeLeftOut: -n "", -one-wave "", -loop-n "" and -hot "" leave
// those cases out, but not all of them.
func TestCasesMayBeLeftOut(t *testing.T) {
	c, err := parseConfig([]string{"-n", "100", "-reps", "3", "-one-wave", "", "-loop-n", "", "-hot", ""})
	if err != nil {
		t.Fatal(err)
	}
	if cs := c.cases(); len(cs) != 1 || cs[0].label() != "N=100" || cs[0].reps != 3 || cs[0].budgetPerTask() != 2*taskBudget {
		t.Errorf("cases %+v, want N=100 alone, 3 reps, twice the tasks' token_budgets", cs)
	}
	if hot := c.hotCases(); len(hot) != 0 {
		t.Errorf("-hot \"\": hot-tenant cases %+v", hot)
	}
	c, err = parseConfig([]string{"-n", "", "-one-wave", "", "-loop-n", "", "-hot", "2000", "-hot-reps", "2", "-hot-calls", "1"})
	if err != nil {
		t.Fatal(err)
	}
	if hot := c.hotCases(); len(c.cases()) != 0 || len(hot) != 1 || hot[0].label() != "hot tenant, N=2000, 1 call of 1s" || hot[0].reps != 2 {
		t.Errorf("the hot-tenant case alone: cases %+v, hot %+v", c.cases(), hot)
	}
	if _, err := parseConfig([]string{"-n", "", "-one-wave", "", "-loop-n", "", "-hot", ""}); err == nil {
		t.Error("every case left out: accepted")
	}
}

// TestInFlight: the peak and the mean of the calls in flight, and the
// middle, when every task is in its loop.
func TestInFlight(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(0, 0).Add(time.Duration(ms) * time.Millisecond) }
	// Two tasks of two calls of 1 s: a from 0 to 1,000 and 1,100 to 2,100;
	// b from 500 to 1,500 and 1,500 to 2,500 (its second call starts as its
	// first ends: not three in flight).
	calls := []llm.CallRecord{
		{TaskID: "a", Start: at(0), End: at(1000)}, {TaskID: "a", Start: at(1100), End: at(2100)},
		{TaskID: "b", Start: at(500), End: at(1500)}, {TaskID: "b", Start: at(1500), End: at(2500)},
	}
	from, to := middle(calls)
	if !from.Equal(at(500)) || !to.Equal(at(2100)) {
		t.Errorf("middle %v..%v, want 500..2100 ms", from.Sub(at(0)), to.Sub(at(0)))
	}
	// From 500 to 2,100 (1.6 s): 2 in flight but from 1,000 to 1,100.
	peak, mean := inFlight(calls, from, to)
	if want := (2*1.6 - 0.1) / 1.6; peak != 2 || math.Abs(mean-want) > 1e-9 {
		t.Errorf("inFlight: peak %d, mean %v; want 2, %v", peak, mean, want)
	}
	if _, mean := inFlight(calls, at(2100), at(500)); mean != 0 {
		t.Errorf("no middle: mean %v, want 0", mean)
	}
}

// TestDeploymentsByLatency: the cases of one sim latency share a fanout
// deployment, in the order the latencies first appear.
func TestDeploymentsByLatency(t *testing.T) {
	ms := time.Millisecond
	cases := []benchCase{{latency: 700 * ms}, {latency: 500 * ms}, {latency: 700 * ms}}
	if got := byLatency(cases); len(got) != 2 || !slices.Equal(got[0], []int{0, 2}) || !slices.Equal(got[1], []int{1}) {
		t.Errorf("byLatency: %v, want [[0 2] [1]]", got)
	}
}
