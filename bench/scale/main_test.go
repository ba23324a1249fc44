package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestDefaultsAreIssue44s: at full size, the scenarios are the issue's.
func TestDefaultsAreIssue44s(t *testing.T) {
	c, err := parseConfig([]string{"-fanout", "/tmp/fanout"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.scenarios, scenarios) || c.workers != 3 {
		t.Errorf("scenarios %v, workers %d; want %v over 3", c.scenarios, c.workers, scenarios)
	}
	if c.wideTasks != 10_000 || c.wideRuns != 100 || c.wideRunTasks != 100 || c.wideCalls != 3 || c.wideLatency != 2*time.Second || c.tool != "memory" {
		t.Errorf("wide: %d tasks, %d runs of %d, %d calls of %v, tool %s", c.wideTasks, c.wideRuns, c.wideRunTasks, c.wideCalls, c.wideLatency, c.tool)
	}
	if !slices.Equal(c.memoryTasks, []int{1000, 10_000}) || c.memoryLatency != 4*time.Second {
		t.Errorf("memory: %v tasks, calls of %v", c.memoryTasks, c.memoryLatency)
	}
	if c.cancelRuns != 1000 || c.orchestrators != 2 {
		t.Errorf("cancel: %d runs over %d orchestrators", c.cancelRuns, c.orchestrators)
	}
	if c.noisyHot != 2000 || c.noisyTenants != 50 || c.noisySmallTasks != 10 || c.noisyLatency != 500*time.Millisecond {
		t.Errorf("noisy: %d hot, %d tenants of %d tasks of %v", c.noisyHot, c.noisyTenants, c.noisySmallTasks, c.noisyLatency)
	}
	// 10,000 subagents over 3 workers: 3,400 each.
	if got := capacityFor(10_000, 3); got != 3400 {
		t.Errorf("capacityFor(10000, 3) = %d, want 3400", got)
	}
}

// TestScaledDown: -scenario picks, -tasks scales every scenario down.
func TestScaledDown(t *testing.T) {
	c, err := parseConfig([]string{"-scenario", "wide,cancel", "-tasks", "1000"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.scenarios, []string{"wide", "cancel"}) {
		t.Errorf("scenarios %v", c.scenarios)
	}
	if c.wideTasks != 1000 || c.wideRuns != 10 || c.wideRunTasks != 100 || !slices.Equal(c.memoryTasks, []int{100, 1000}) ||
		c.cancelRuns != 100 || c.noisyHot != 200 {
		t.Errorf("-tasks 1000: wide %d, %dx%d, memory %v, cancel %d, noisy %d", c.wideTasks, c.wideRuns, c.wideRunTasks,
			c.memoryTasks, c.cancelRuns, c.noisyHot)
	}
	for _, bad := range [][]string{{"-scenario", "wid"}, {"-tool", "fetch"}, {"-memory-tasks", "0"}, {"-wide-calls", "1"}, {"-noisy-hot-calls", "51"}} {
		if _, err := parseConfig(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	s, err := parseConfig([]string{"-smoke"})
	if err != nil || s.wideTasks != smokeTasks || s.cancelRuns != 4 || s.runLimit != 2*time.Minute {
		t.Errorf("-smoke: %d tasks, %d cancel runs, run timeout %v (%v)", s.wideTasks, s.cancelRuns, s.runLimit, err)
	}
}

// TestGCTrace: the live heap and the stacks of a gctrace line, per node.
func TestGCTrace(t *testing.T) {
	g := newGCTraces()
	g.line("w1", "gc 7 @2.010s 3%: 0.1+2.3+0.02 ms clock, 0.2+0.5/1.1/0+0.04 ms cpu, 48->52->21 MB, 50 MB goal, 3 MB stacks, 0 MB globals, 2 P")
	g.line("w1", `{"msg":"worker serving"}`)
	got, ok := g.get("w1")
	if !ok || got.live != 21<<20 || got.stacks != 3<<20 || got.gcs != 1 {
		t.Errorf("w1: %+v, %v; want 21 MiB live, 3 MiB stacks, 1 GC", got, ok)
	}
	if _, ok := g.get("w2"); ok {
		t.Error("w2 has a heap without a gctrace line")
	}
}

func TestPercentiles(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	if got := percentiles(ds); !strings.HasPrefix(got, "50 / 99 / 100 ms") {
		t.Errorf("percentiles = %q", got)
	}
}
