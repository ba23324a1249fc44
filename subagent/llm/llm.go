// Package llm is the model seam of the agent loop: the Model interface every
// provider implements, upper bounds of a call's input tokens, and Sim, a
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
	// IsError marks a tool message that reports a failed call (Anthropic's
	// is_error; OpenAI has no field for it, so the content says it).
	IsError bool
}

// ToolDef describes a tool the model may call.
type ToolDef struct {
	Name        string
	Description string
	// Schema is the JSON Schema of the arguments object, sent as the
	// provider's parameters (OpenAI) or input_schema (Anthropic); nil is
	// an object with no properties.
	Schema json.RawMessage
}

// ToolCall is the model asking to run a tool.
type ToolCall struct {
	ID   string
	Name string
	// Args is the JSON object of arguments as the model wrote it: numbers,
	// arrays, nested objects and absent optional fields survive the trip.
	Args json.RawMessage
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
	TenantID      string // the run's tenant, for the 429 counter; may be empty
	RunID         string
	TaskID        string
	Iteration     int
	ReservationID int64
}

// Request is one model call.
type Request struct {
	Model     string // provider-specific model name; empty = provider default
	Messages  []Message
	Tools     []ToolDef
	MaxTokens int // output cap, >= 1
	// InputBound, if > 0, is the caller's upper bound of the call's input
	// tokens: what it reserved for input (Estimator.Bound). Providers debit
	// it plus MaxTokens from their rate limits before each attempt; 0 makes
	// them use InputBound of Messages and Tools. Never sent.
	InputBound  int64
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
