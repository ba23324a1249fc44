package runs

import "fmt"

// FanOutTool is the name of the workers' built-in tool that starts a child
// run under the calling task (RunSpec.fan_out).
const FanOutTool = "fan_out"

// TreeFullError is a child run refused because its tree would have more
// tasks than its root run's RunSpec.fan_out.max_tree_tasks, every level
// counted (docs/budget.md#nested-fan-out).
type TreeFullError struct {
	Root  string // the root run
	Limit int    // fan_out.max_tree_tasks
	Used  int    // tasks the tree has
	Asked int    // tasks the child would add
}

func (e *TreeFullError) Error() string {
	return fmt.Sprintf("fan_out.max_tree_tasks: the tree under run %s has %d of its %d tasks; a child of %d more would pass it",
		e.Root, e.Used, e.Limit, e.Asked)
}

// ChildLink is what a child run's end owes: the run and task that started
// it, and the fan_out call (its tool_call key) it answers.
type ChildLink struct {
	ParentRunID  string
	ParentTaskID string
	Call         string
}
