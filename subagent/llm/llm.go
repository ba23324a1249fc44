// Package llm is the model seam of the agent loop: the Model interface every
// provider implements, a conservative token estimator, and Sim, a
// deterministic model for tests and the dev server.
package llm

import (
	"context"
	"encoding/json"
)

// Role is who wrote a message.
type Role string

// The message roles.
const (
	RoleSystem    Role = "system"
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
	RoleTool      Role = "tool"
)

// Message is one entry of a conversation.
type Message struct {
	Role       Role
	Content    string
	ToolCalls  []ToolCall // an assistant message's tool calls
	ToolCallID string     // a tool message answers this call
}

// ToolDef describes a tool the model may call.
type ToolDef struct {
	Name        string
	Description string
	Params      map[string]string // argument name -> description; arguments are strings
}

// ToolCall is the model asking to run a tool.
type ToolCall struct {
	ID   string
	Name string
	Args map[string]string
}

// FinishReason says why the model stopped producing output.
type FinishReason string

// The finish reasons.
const (
	FinishStop      FinishReason = "stop"       // a final answer
	FinishToolCalls FinishReason = "tool_calls" // the model wants tool results
	FinishLength    FinishReason = "length"     // output hit MaxTokens
)

// Usage is the tokens a call consumed, as reported by the provider.
type Usage struct {
	InputTokens  int64
	OutputTokens int64
}

// Total reports input plus output tokens.
func (u Usage) Total() int64 { return u.InputTokens + u.OutputTokens }

// Meta ties a call to the ledger: which run, task and iteration made it and
// which reservation pays for it. Providers may log it; they never send it.
type Meta struct {
	RunID         string
	TaskID        string
	Iteration     int
	ReservationID int64
}

// Request is one model call.
type Request struct {
	Model       string // provider-specific model name; empty = provider default
	Messages    []Message
	Tools       []ToolDef
	MaxTokens   int // output cap, >= 1
	Temperature float64
	Seed        int64 // 0 = provider default
	Meta        Meta
}

// Response is a completed call.
type Response struct {
	Content      string
	ToolCalls    []ToolCall
	Usage        Usage
	FinishReason FinishReason
}

// Model is one LLM provider.
type Model interface {
	// Name identifies the provider, e.g. "sim".
	Name() string
	// Call runs one completion. It returns promptly with context.Cause(ctx)
	// once ctx ends. On any error the call's usage is unknown and the caller
	// must count it as its whole reservation.
	Call(ctx context.Context, req Request) (Response, error)
}

// DefaultModeler is a Model that names the model it calls when
// Request.Model is empty, for telemetry (gen_ai.request.model).
type DefaultModeler interface {
	DefaultModel() string
}

// Per-item overheads of EstimateTokens: role markers and framing that
// providers bill but bytes do not show.
const (
	messageOverhead = 8
	toolOverhead    = 16
)

// EstimateTokens returns a conservative estimate of the input tokens of
// msgs plus tools: one token per 3 bytes (real tokenizers average about 4)
// plus a fixed overhead per message, tool call and tool definition. It is
// what the agent loop reserves for input, so it errs high.
func EstimateTokens(msgs []Message, tools ...ToolDef) int64 {
	var n int64
	for _, m := range msgs {
		n += messageOverhead + bytesToTokens(len(m.Content)+len(m.ToolCallID))
		for _, c := range m.ToolCalls {
			n += toolOverhead + bytesToTokens(len(c.ID)+len(c.Name)+jsonLen(c.Args))
		}
	}
	for _, t := range tools {
		n += toolOverhead + bytesToTokens(len(t.Name)+len(t.Description)+jsonLen(t.Params))
	}
	return n
}

func bytesToTokens(n int) int64 { return int64(n+2) / 3 }

func jsonLen(v map[string]string) int {
	if len(v) == 0 {
		return 0
	}
	b, _ := json.Marshal(v) // A map of strings always marshals.
	return len(b)
}
