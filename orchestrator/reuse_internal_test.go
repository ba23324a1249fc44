package orchestrator

import (
	"testing"

	"google.golang.org/protobuf/proto"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
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
