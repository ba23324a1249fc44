package llm

import (
	"encoding/json"
	"fmt"
	"strings"
)

// The Sim fans out (the workers' fan_out tool, docs/budget.md#nested-fan-out)
// when its task's instruction says so and the request offers the tool:
// "fan out(a | b | c)" makes its first reply one fan_out call with the
// tasks a, b and c; a task may fan out again ("fan out(a | b fan out(c |
// d))": b's own instruction is "b fan out(c | d)"). Once the call is
// answered it answers with its own facts and, after them, the child's,
// one fact per "- " line of the tool's result: so the facts of every level
// rise to the root, as a model's summary would carry them.

// simFanOutTool is the workers' built-in tool (runs.FanOutTool).
const simFanOutTool = "fan_out"

// simFanOut returns the fan_out call the request's instruction asks for,
// if the request offers the tool and no fan_out was made yet.
func simFanOut(req Request) (ToolCall, bool) {
	offered := false
	for _, t := range req.Tools {
		offered = offered || t.Name == simFanOutTool
	}
	if !offered || simFannedOut(req.Messages) {
		return ToolCall{}, false
	}
	tasks := FanOutTasks(simInstruction(req.Messages))
	if len(tasks) == 0 {
		return ToolCall{}, false
	}
	args, _ := json.Marshal(map[string]any{"tasks": tasks}) // strings always marshal
	return ToolCall{ID: fmt.Sprintf("call_%d_fan_out", req.Meta.Iteration), Name: simFanOutTool, Args: args}, true
}

// simFannedOut reports whether the conversation has a fan_out call.
func simFannedOut(msgs []Message) bool {
	for _, m := range msgs {
		for _, c := range m.ToolCalls {
			if c.Name == simFanOutTool {
				return true
			}
		}
	}
	return false
}

// simInstruction is the task's instruction: its last user message before
// the work began.
func simInstruction(msgs []Message) string {
	in := ""
	for _, m := range msgs {
		if m.Role == RoleAssistant {
			break
		}
		if m.Role == RoleUser && m.Content != CompressInstruction {
			in = m.Content
		}
	}
	return in
}

// FanOutTasks parses the first "fan out(...)" of an instruction: the
// tasks between its parentheses, split at the "|" outside nested ones,
// trimmed, empty ones dropped. None if it has no such phrase or it is not
// closed.
func FanOutTasks(instruction string) []string {
	const open = "fan out("
	at := strings.Index(instruction, open)
	if at < 0 {
		return nil
	}
	var tasks []string
	depth, start := 0, at+len(open)
	for i := start; i < len(instruction); i++ {
		switch instruction[i] {
		case '(':
			depth++
		case ')':
			if depth == 0 {
				if t := strings.TrimSpace(instruction[start:i]); t != "" {
					tasks = append(tasks, t)
				}
				return tasks
			}
			depth--
		case '|':
			if depth == 0 {
				if t := strings.TrimSpace(instruction[start:i]); t != "" {
					tasks = append(tasks, t)
				}
				start = i + 1
			}
		}
	}
	return nil
}

// simChildFacts are the facts of the answers to the conversation's fan_out
// calls: one per "- " line, its "[...]" tail its sources.
func simChildFacts(msgs []Message) (texts []string, sources [][]string) {
	fanOuts := map[string]bool{}
	for _, m := range msgs {
		for _, c := range m.ToolCalls {
			if c.Name == simFanOutTool {
				fanOuts[c.ID] = true
			}
		}
		if m.Role != RoleTool || !fanOuts[m.ToolCallID] || m.IsError {
			continue
		}
		t, s := ChildAnswerFacts(m.Content)
		texts, sources = append(texts, t...), append(sources, s...)
	}
	return texts, sources
}

// ChildAnswerFacts are the facts of a child run's answer to a fan_out
// call (the orchestrator's childAnswer): one per "- " line, its "[...]"
// tail its sources.
func ChildAnswerFacts(answer string) (texts []string, sources [][]string) {
	for line := range strings.Lines(answer) {
		text, ok := strings.CutPrefix(strings.TrimSpace(line), "- ")
		if !ok {
			continue
		}
		var src []string
		if i := strings.LastIndex(text, " ["); i >= 0 && strings.HasSuffix(text, "]") {
			src = strings.Fields(text[i+2 : len(text)-1])
			text = text[:i]
		}
		texts, sources = append(texts, text), append(sources, src)
	}
	return texts, sources
}

// withoutFanOut is tools without fan_out.
func withoutFanOut(tools []ToolDef) []ToolDef {
	out := make([]ToolDef, 0, len(tools))
	for _, t := range tools {
		if t.Name != simFanOutTool {
			out = append(out, t)
		}
	}
	return out
}
