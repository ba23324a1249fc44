package main

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/llm"
	"github.com/fanout/fanout/subagent/llm/llmtest"
)

// TestDefaultsAreIssue45s: by default, the issue's load: 20 runs of 50
// tasks on one key, 600 RPM / 200k TPM, calls of 300 to 500 ms, against a
// fixed concurrency of 16; the workers given no limit flags.
func TestDefaultsAreIssue45s(t *testing.T) {
	c, err := parseConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.runs != 20 || c.tasks != 50 || c.rpm != 600 || c.tpm != 200_000 || c.fixed != 16 ||
		c.latencyMin != 300*time.Millisecond || c.latencyMax != 500*time.Millisecond || !slices.Equal(c.modes, []string{modeLearn}) {
		t.Errorf("%d runs of %d, %d RPM / %d TPM, fixed %d, calls of %v-%v, modes %v",
			c.runs, c.tasks, c.rpm, c.tpm, c.fixed, c.latencyMin, c.latencyMax, c.modes)
	}
	s, err := parseConfig([]string{"-smoke", "-mode", "learn,flags,learn"})
	if err != nil || s.runs != 2 || s.tasks != 5 || !slices.Equal(s.modes, modes) {
		t.Errorf("-smoke: %d runs of %d, modes %v (%v)", s.runs, s.tasks, s.modes, err)
	}
	for _, bad := range [][]string{{"-mode", "guess"}, {"-runs", "0"}, {"-fixed", "0"}, {"-tpm", "0"},
		{"-latency-min", "2s", "-latency-max", "1s"}, {"extra"}} {
		if _, err := parseConfig(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// at is a sample s seconds after t0.
func at(t0 time.Time, s float64, answered int, tokens int64) sample {
	return sample{at: t0.Add(time.Duration(s * float64(time.Second))), answered: answered, tokens: tokens}
}

// TestSteadyLeavesOutTheBurstAndTheTail: the steady rate is the middle's,
// from a tenth of the answered calls to nine tenths; the whole rate is every
// call over the wall time.
func TestSteadyLeavesOutTheBurstAndTheTail(t *testing.T) {
	t0 := time.Now()
	// 100 calls in the first second (a burst), then 10 a second for 80 s
	// (100 tokens each), then nothing for 19 s: 900 calls.
	samples := []sample{at(t0, 0, 0, 0), at(t0, 1, 100, 10_000)}
	for s := 2; s <= 81; s++ {
		samples = append(samples, at(t0, float64(s), 100+10*(s-1), int64(10_000+1_000*(s-1))))
	}
	samples = append(samples, at(t0, 100, 900, 90_000))
	r, ok := steady(samples)
	if !ok || r.rpm != 600 || r.tpm != 60_000 {
		t.Errorf("steady %+v, %v; want 600 RPM, 60,000 TPM", r, ok)
	}
	if w := whole(samples, 100*time.Second); w.rpm != 540 || math.Round(w.tpm) != 54_000 {
		t.Errorf("whole %+v; want 900 calls over 100 s: 540 RPM", w)
	}
	if _, ok := steady(samples[:1]); ok {
		t.Error("one sample has a steady part")
	}
	if _, ok := steady([]sample{at(t0, 0, 0, 0), at(t0, 5, 0, 0)}); ok {
		t.Error("no calls have a steady part")
	}
}

// TestTheTableComparesWithTheFixedArm: the 429s' share of the calls, the
// latency quantiles, the ledger's tokens, and each arm against the fixed
// one of its mode.
func TestTheTableComparesWithTheFixedArm(t *testing.T) {
	t0 := time.Now()
	task := func(status fanoutv1.TaskStatus, took time.Duration, tokens int64) *fanoutv1.TaskOutcome {
		return &fanoutv1.TaskOutcome{Status: status, TokensSpent: tokens,
			StartedAt: timestamppb.New(t0), FinishedAt: timestamppb.New(t0.Add(took))}
	}
	ok := fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED
	fixed := &arm{mode: modeLearn, fixed: 16, wall: 100 * time.Second, runs: map[string]int{"SUCCEEDED": 1},
		samples: []sample{at(t0, 0, 0, 0), at(t0, 10, 80, 8_000), at(t0, 90, 720, 72_000), at(t0, 100, 800, 80_000)},
		outcomes: []*fanoutv1.TaskOutcome{task(ok, time.Second, 100), task(ok, 2*time.Second, 100),
			task(fanoutv1.TaskStatus_TASK_STATUS_FAILED, 3*time.Second, 50)}}
	fixed.samples[3].limited = 200
	unset := &arm{mode: modeLearn, wall: 50 * time.Second, runs: map[string]int{"SUCCEEDED": 1},
		samples:  []sample{at(t0, 0, 0, 0), at(t0, 5, 80, 8_000), at(t0, 45, 720, 72_000), at(t0, 50, 800, 80_000)},
		outcomes: []*fanoutv1.TaskOutcome{task(ok, time.Second, 100)}}
	s := summarize(fixed)
	if s.calls() != 1000 || s.limitedShare() != 0.2 || s.succeeded != 2 || s.notSucceeded["FAILED"] != 1 ||
		s.p50 != 2*time.Second || s.p95 != 3*time.Second || s.tokens != 250 {
		t.Errorf("fixed arm: %+v", s)
	}
	var out bytes.Buffer
	printTable(&out, config{rpm: 600, tpm: 200_000, runs: 1, tasks: 3}, modeLearn, []*arm{fixed, unset})
	rows := strings.Split(out.String(), "\n")
	row := func(prefix string) string {
		for _, r := range rows {
			if strings.HasPrefix(r, prefix) {
				return r
			}
		}
		t.Fatalf("no row %q in:\n%s", prefix, out.String())
		return ""
	}
	// Steady: the fixed arm's 640 calls from the 80th to the 720th over
	// 80 s, 480 RPM; the unset's over 40 s, 960 RPM, twice the fixed.
	if r := row("| learn/fixed-16 |"); !strings.Contains(r, "| 200 (20.0%) | 480 (0.80) | 480 (0.80) | 48000 (0.24) |") ||
		!strings.Contains(r, "| 2s / 3s | 250 / 80000 | 1.00x | 1.00x |") {
		t.Errorf("fixed row: %s", r)
	}
	if r := row("| learn/unset |"); !strings.Contains(r, "| 960 (1.60) | 960 (1.60) |") || !strings.Contains(r, "| 0.50x | 2.00x |") {
		t.Errorf("unset row: %s", r)
	}
	if r := row("- learn/unset:"); !strings.Contains(r, "no chosen-concurrency event") {
		t.Errorf("unset's line: %s", r)
	}
}

// TestChosenConcurrency: each run's first and last chosen numbers, min /
// median / max.
func TestChosenConcurrency(t *testing.T) {
	a := &arm{mode: modeLearn, chosen: map[string][]chosen{
		"0": {{kind: "concurrency_chosen", n: 12, hasN: true}, {kind: "concurrency_chosen", n: 6, hasN: true}},
		"1": {{kind: "concurrency_chosen", n: 10, hasN: true}},
		"2": {{kind: "concurrency_chosen", n: 14, hasN: true}, {kind: "concurrency_chosen", n: 8, hasN: true}},
	}}
	got := chosenLine(a, 20)
	if !strings.Contains(got, "5 concurrency_chosen events over 3 of 20 runs") || !strings.Contains(got, "first chosen 10 / 12 / 14, last 6 / 8 / 10") {
		t.Errorf("chosenLine = %q", got)
	}
}

// TestScriptMakesThreeCallsATask: a search, an answer once its result is
// in, and facts to the compression call.
func TestScriptMakesThreeCallsATask(t *testing.T) {
	first := script(llmtest.Request{Tools: []string{"search"}, Messages: []map[string]any{{"role": "user", "content": "find"}}})
	if len(first.ToolCalls) != 1 || first.ToolCalls[0].Name != "search" {
		t.Errorf("first call: %+v, want a search", first)
	}
	second := script(llmtest.Request{Tools: []string{"search"}, Messages: []map[string]any{{"role": "user"}, {"role": "assistant"}, {"role": "tool"}}})
	if len(second.ToolCalls) != 0 || second.Text == "" {
		t.Errorf("second call: %+v, want an answer", second)
	}
	compress := script(llmtest.Request{Schema: llm.FactsSchema.Name})
	var facts llm.Compressed
	if err := json.Unmarshal([]byte(compress.Text), &facts); err != nil || len(facts.Facts) == 0 {
		t.Errorf("compression: %q (%v), want facts", compress.Text, err)
	}
}

// TestMockHoldsAnsweredCallsOnly: an answered call waits its latency, the
// same for the same request; a call over the key's limit is answered 429
// with Retry-After; the samples count both.
func TestMockHoldsAnsweredCallsOnly(t *testing.T) {
	const key = "sk-test"
	m := newMock(key, 1, 1_000_000, 50*time.Millisecond, 80*time.Millisecond, time.Hour)
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`)
	if d := m.latency(body); d < m.min || d > m.max || d != m.latency(body) {
		t.Errorf("latency %v: not the same each time within [%v, %v]", d, m.min, m.max)
	}
	call := func() (int, string, time.Duration) {
		req, err := http.NewRequest(http.MethodPost, m.BaseURL()+"chat/completions", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		began := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After"), time.Since(began)
	}
	// 1 RPM: the bucket holds one call.
	if code, _, took := call(); code != http.StatusOK || took < m.latency(body) {
		t.Errorf("first call: %d after %v, want 200 after at least %v", code, took, m.latency(body))
	}
	if code, retryAfter, _ := call(); code != http.StatusTooManyRequests || retryAfter == "" {
		t.Errorf("second call: %d, Retry-After %q; want 429 with one", code, retryAfter)
	}
	samples := m.close()
	if last := samples[len(samples)-1]; last.answered != 1 || last.limited != 1 || last.tokens == 0 {
		t.Errorf("last sample %+v, want 1 answered (with its tokens), 1 limited", last)
	}
}
