package orchestrator

import (
	"math"
	"testing"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// TestRunConcurrencyIsCappedAndDefaulted: the concurrency a run is driven
// with (plan.concurrency, which startReady holds the run's tasks in flight
// to; TestRunHoldsExactlyMaxConcurrencyTasksInFlight measures that part),
// computed as the engine computes it: the Config withDefaults, as NewEngine
// fills it, then plan, as StartRun and adoption call it. docs/runs.md:23
// ("limits.maxConcurrency: 16 (--default-concurrency), capped by
// --max-concurrency"), docs/flags.md:36, 39 (16 and 256). Both the zero Config
// (fanout dev, tests) and DefaultConfig (the server commands' flag
// defaults) are checked, at the cap's edge and far above it.
func TestRunConcurrencyIsCappedAndDefaulted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		cfg  Config
		spec int32 // spec.limits.max_concurrency; 0: unset
		want int
	}{
		{"unset takes the default 16", Config{}, 0, 16},
		{"unset takes the default 16 (flag defaults)", DefaultConfig(), 0, 16},
		{"1 is kept", Config{}, 1, 1},
		{"17 is kept: the default is no cap", Config{}, 17, 17},
		{"255 is kept", Config{}, 255, 255},
		{"256 is kept", Config{}, 256, 256},
		{"257 lowered to the cap 256", Config{}, 257, 256},
		{"300 lowered to the cap 256", Config{}, 300, 256},
		{"300 lowered to the cap 256 (flag defaults)", DefaultConfig(), 300, 256},
		{"MaxInt32 lowered to the cap 256", Config{}, math.MaxInt32, 256},
		{"--max-concurrency 4: 5 lowered to 4", Config{MaxConcurrency: 4}, 5, 4},
		{"--max-concurrency 4: 4 is kept", Config{MaxConcurrency: 4}, 4, 4},
		{"--max-concurrency 4: unset takes the default, capped to 4", Config{MaxConcurrency: 4}, 0, 4},
		{"--default-concurrency 3: unset takes 3", Config{DefaultConcurrency: 3}, 0, 3},
		{"--default-concurrency 3: 300 still lowered to 256", Config{DefaultConcurrency: 3}, 300, 256},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec := &fanoutv1.RunSpec{
				IdempotencyKey: "concurrency", Goal: "find facts",
				Budget: &fanoutv1.Budget{LimitTokens: 100_000},
				Model:  &fanoutv1.ModelSettings{Provider: "sim"},
				Tasks:  []*fanoutv1.TaskSpec{{Id: "t1", Instruction: "look up", TokenBudget: 1_000}},
			}
			if c.spec != 0 {
				spec.Limits = &fanoutv1.Limits{MaxConcurrency: c.spec}
			}
			p, err := c.cfg.withDefaults().plan(spec)
			if err != nil {
				t.Fatalf("spec with maxConcurrency %d refused: %v (the cap lowers it, never refuses)", c.spec, err)
			}
			if p.concurrency != c.want {
				t.Errorf("maxConcurrency %d (config MaxConcurrency %d, DefaultConcurrency %d): the run is driven %d at once, want %d",
					c.spec, c.cfg.MaxConcurrency, c.cfg.DefaultConcurrency, p.concurrency, c.want)
			}
		})
	}
}
