package main

import (
	"strings"
	"testing"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// TestGetAndTraceShowTheChosenConcurrency: a run sized from the rate limits
// (docs/operations.md, "Concurrency from the rate limits") shows its
// concurrency and why in `fanout get` (Run.concurrency), and each change in
// `fanout trace` (its ConcurrencyChosen events).
func TestGetAndTraceShowTheChosenConcurrency(t *testing.T) {
	const why = "7 = 600 RPM × 0.7 ÷ 60 s × 2.00 s per call ÷ 2 runs sharing the limit"
	var get strings.Builder
	printRun(&get, &fanoutv1.Run{RunId: "r", Concurrency: &fanoutv1.ConcurrencyChosen{Concurrency: 7, Reason: why}})
	if !strings.Contains(get.String(), "concurrency: 7 tasks at once, from the rate limits: "+why) {
		t.Errorf("fanout get printed:\n%s\nwant the run's concurrency and why", get.String())
	}
	evs := traceEvents(fanoutv1.RunState_RUN_STATE_SUCCEEDED, false)
	evs = append(evs[:1], append([]*fanoutv1.RunEvent{{Time: evs[1].GetTime(), Event: &fanoutv1.RunEvent_ConcurrencyChosen{
		ConcurrencyChosen: &fanoutv1.ConcurrencyChosen{Concurrency: 7, Reason: why}}}}, evs[1:]...)...)
	var trace strings.Builder
	drawTimeline(&trace, evs, 50)
	if !strings.Contains(trace.String(), "concurrency 7 at +10ms: "+why) {
		t.Errorf("fanout trace printed:\n%s\nwant the concurrency chosen, when and why", trace.String())
	}
}
