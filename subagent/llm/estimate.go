package llm

import "encoding/json"

// Margins of the input bounds: the role markers, chat-template framing and
// tool-schema wrapping that providers bill but the bytes counted here do not
// show. Real templates spend 3 to 5 tokens per message.
const (
	messageOverhead = 8  // per message
	toolOverhead    = 16 // per tool call and per tool definition
)

// InputBound returns an upper bound of the input tokens of a call on msgs
// offering tools: one token per UTF-8 byte of every message's content and
// tool call id, of each tool call's id, name and JSON arguments and of each
// tool definition's name, description and JSON schema (as sent), plus
// messageOverhead per message and toolOverhead per tool call and tool
// definition. A byte-level BPE tokenizer never yields more tokens than
// bytes, so however densely the text tokenizes (non-ASCII text, code) a
// provider cannot bill more, as long as its framing stays within the
// margins. It counts every byte, so it is 3 to 4 times what English text
// costs; Estimator is as safe and much tighter once a call of the
// conversation has reported its usage.
func InputBound(msgs []Message, tools ...ToolDef) int64 {
	var n int64
	for _, m := range msgs {
		n += messageBound(m)
	}
	for _, t := range tools {
		n += toolBound(t)
	}
	return n
}

func messageBound(m Message) int64 {
	n := int64(messageOverhead + len(m.Content) + len(m.ToolCallID))
	for _, c := range m.ToolCalls {
		n += toolOverhead + int64(len(c.ID)+len(c.Name)+jsonLen(c.Args))
	}
	return n
}

func toolBound(t ToolDef) int64 {
	b, _ := json.Marshal(toolSchema(t)) // Plain maps and strings always marshal.
	return toolOverhead + int64(len(t.Name)+len(t.Description)+len(b))
}

func jsonLen(v json.RawMessage) int { return len(v) }

// Estimator bounds the input tokens of each call of one conversation that
// only grows, as the agent loop's does: it keeps one per task. A call's
// prompt is the previous call's prompt, plus that call's completion, plus
// what was appended since (tool results). The provider reported the first
// two as the previous call's input and output tokens, so the next call's
// input is at most those, plus one token per byte of what was appended
// since (see InputBound), plus messageOverhead per message and
// toolOverhead per tool call for their framing. That is as safe as
// InputBound of the whole conversation and, past the first call, close to
// the real usage.
//
// With nothing recorded (a task's first call) or after a call whose usage
// was not reported, Bound is InputBound of the whole conversation.
//
// The zero value is ready to use. Not safe for concurrent use.
type Estimator struct {
	base   int64 // the recorded call's reported input + output tokens; 0 = none
	prompt int   // the messages of its prompt
}

// Record notes that a call whose prompt was the first n messages of the
// conversation reported usage u. The conversation's next message, if it is
// an assistant message, must be that call's completion. A usage with no
// input tokens (the provider reported none) forgets the record, so the
// next Bound counts every byte.
func (e *Estimator) Record(n int, u Usage) {
	if u.InputTokens <= 0 || u.OutputTokens < 0 {
		*e = Estimator{}
		return
	}
	*e = Estimator{base: u.Total(), prompt: n}
}

// Bound returns an upper bound of the input tokens of a call on msgs
// offering tools. msgs must begin with the recorded call's prompt,
// unchanged, and tools must be that call's tools or fewer: their tokens
// are in the recorded input.
func (e *Estimator) Bound(msgs []Message, tools ...ToolDef) int64 {
	if e.base <= 0 || len(msgs) < e.prompt {
		return InputBound(msgs, tools...)
	}
	n := e.base
	added := msgs[e.prompt:]
	if len(added) > 0 && added[0].Role == RoleAssistant {
		// The recorded call's completion: its tokens are in the reported
		// output; only its framing as input is new.
		n += messageOverhead + toolOverhead*int64(len(added[0].ToolCalls))
		added = added[1:]
	}
	return n + InputBound(added)
}
