package orchestrator

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// TestContentKeys: a task's content key changes with what it is asked and
// with what any task above it is asked, and not with how it is run (its
// id, budget, iterations) nor with the order of its tools
// (docs/budget.md#fork).
func TestContentKeys(t *testing.T) {
	t.Parallel()
	base := &fanoutv1.RunSpec{Goal: "g", Model: &fanoutv1.ModelSettings{Provider: "sim", Seed: 7}, Tasks: []*fanoutv1.TaskSpec{
		{Id: "a", Instruction: "find a", AllowedTools: []string{"search", "fetch"}, TokenBudget: 100},
		{Id: "b", Instruction: "find b", DependsOn: []string{"a"}, TokenBudget: 100},
		{Id: "c", Instruction: "find c", TokenBudget: 100},
	}}
	keys := contentKeys(base)
	for _, tc := range []struct {
		name   string
		change func(*fanoutv1.RunSpec)
		same   []bool // by task: the key stays
	}{
		{"a's instruction", func(s *fanoutv1.RunSpec) { s.Tasks[0].Instruction = "find A" }, []bool{false, false, true}},
		{"a's tools", func(s *fanoutv1.RunSpec) { s.Tasks[0].AllowedTools = []string{"search"} }, []bool{false, false, true}},
		{"a's tools reordered", func(s *fanoutv1.RunSpec) { s.Tasks[0].AllowedTools = []string{"fetch", "search"} }, []bool{true, true, true}},
		{"the goal", func(s *fanoutv1.RunSpec) { s.Goal = "h" }, []bool{false, false, false}},
		{"the model's seed", func(s *fanoutv1.RunSpec) { s.Model.Seed = 8 }, []bool{false, false, false}},
		{"budgets and iterations", func(s *fanoutv1.RunSpec) {
			for _, task := range s.Tasks {
				task.TokenBudget, task.MaxIterations = 999, 3
			}
		}, []bool{true, true, true}},
		{"c's id", func(s *fanoutv1.RunSpec) { s.Tasks[2].Id = "z" }, []bool{true, true, true}},
	} {
		s := proto.CloneOf(base)
		tc.change(s)
		got := contentKeys(s)
		for i := range keys {
			if (got[i] == keys[i]) != tc.same[i] {
				t.Errorf("%s changed: task %s's key the same %t, want %t", tc.name, s.Tasks[i].GetId(), got[i] == keys[i], tc.same[i])
			}
		}
	}
}

// recordedFake answers CachedTasks from a map by content key.
type recordedFake map[string]runs.Recorded

func (f recordedFake) CachedTasks(_ context.Context, _ string, keys []string, _ time.Duration) ([]runs.Recorded, error) {
	var out []runs.Recorded
	for _, k := range keys {
		if r, ok := f[k]; ok {
			out = append(out, r)
		}
	}
	return out, nil
}

func (recordedFake) SentWrites(context.Context, string, string) (map[string]int32, error) {
	return nil, nil
}

// TestReuseRules (docs/budget.md#fork, docs/budget.md#the-result-cache):
// a dependent is reused only from the run its dependency is reused from
// (its facts were drawn from that run's); a cached task that wrote is
// never taken from the cache; a fork refuses to run again, unchanged, a
// source task that sent writes and did not succeed.
func TestReuseRules(t *testing.T) {
	t.Parallel()
	spec := &fanoutv1.RunSpec{Goal: "g", Model: &fanoutv1.ModelSettings{Provider: "sim"},
		Cache: &fanoutv1.CacheSettings{TaskMaxAge: durationpb.New(time.Hour)}, Tasks: []*fanoutv1.TaskSpec{
			{Id: "a", Instruction: "find a", TokenBudget: 100},
			{Id: "b", Instruction: "find b", DependsOn: []string{"a"}, TokenBudget: 100},
			{Id: "c", Instruction: "write c", TokenBudget: 100},
		}}
	keys := contentKeys(spec)
	ok := func(id string) *fanoutv1.TaskOutcome {
		return &fanoutv1.TaskOutcome{TaskId: id, Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED}
	}
	// The source S: a succeeded, b failed; an older run X has b succeeded;
	// run W has c succeeded, and c wrote.
	src := &forkSource{runID: "S", byKey: map[string]*fanoutv1.TaskOutcome{keys[0]: ok("a")}, writes: map[string]int32{},
		wrote: map[string]*fanoutv1.TaskOutcome{}}
	e := &Engine{records: recordedFake{
		keys[1]: {ContentKey: keys[1], RunID: "X", Outcome: ok("b")},
		keys[2]: {ContentKey: keys[2], RunID: "W", Outcome: ok("c"), Writes: 1},
	}}
	p := &plan{spec: spec, deps: [][]int{nil, {0}, nil}}
	reused, _, why, err := e.reuse(t.Context(), p, src)
	if err != nil {
		t.Fatal(err)
	}
	if reused[0] == nil || reused[1] != nil || reused[2] != nil {
		t.Errorf("reused %v (why %v); want a only: b's dependency is reused from S, b from X; c wrote", reused, why)
	}
	// The source's c sent a write and failed: an unchanged c is refused.
	src.wrote[keys[2]] = &fanoutv1.TaskOutcome{TaskId: "c", Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED}
	src.writes["c"] = 2
	if _, _, _, err := e.reuse(t.Context(), p, src); err == nil || !strings.Contains(err.Error(), "tasks[c]") {
		t.Errorf("a fork that would run c again: %v; want an error naming tasks[c]", err)
	}
}
