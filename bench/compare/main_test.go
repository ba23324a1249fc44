package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
	if c, err := parseConfig([]string{"-smoke", "-timeout", "1m"}); err != nil || c.total != time.Minute {
		t.Errorf("-smoke -timeout 1m: %v, %v", c.total, err)
	}
	for _, flag := range []string{"-n", "-reps", "-warmup", "-one-wave", "-one-wave-reps", "-loop-n", "-loop-reps"} {
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

// TestCasesMayBeLeftOut: -one-wave "" and -loop-n "" leave those cases out.
func TestCasesMayBeLeftOut(t *testing.T) {
	c, err := parseConfig([]string{"-n", "100", "-reps", "3", "-one-wave", "", "-loop-n", ""})
	if err != nil {
		t.Fatal(err)
	}
	if cs := c.cases(); len(cs) != 1 || cs[0].label() != "N=100" || cs[0].reps != 3 || cs[0].budgetPerTask() != 2*taskBudget {
		t.Errorf("cases %+v, want N=100 alone, 3 reps, twice the tasks' token_budgets", cs)
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

func TestRefusedRunsSaySo(t *testing.T) {
	for _, code := range []codes.Code{codes.Unauthenticated, codes.PermissionDenied} {
		err := refused("run 10 tasks", status.Error(code, "no"))
		if !strings.Contains(err.Error(), "REFUSED") || status.Code(errors.Unwrap(err)) != code {
			t.Errorf("%v: %v", code, err)
		}
	}
	if err := refused("run 10 tasks", status.Error(codes.Unavailable, "down")); strings.Contains(err.Error(), "REFUSED") {
		t.Errorf("Unavailable: %v", err)
	}
}
