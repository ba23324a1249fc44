package llm

import (
	"context"
	"encoding/json"
	"strings"
)

// Schema is a JSON schema a structured reply must match.
type Schema struct {
	Name        string         // e.g. "fact_summary"; [a-zA-Z0-9_-], at most 64 bytes
	Description string         // tells the model what the document is for
	JSON        map[string]any // the schema; for OpenAI strict mode every property is required and additionalProperties is false
}

// tokens is the schema's share of an input bound, counted like a tool
// definition (see InputBound); 0 for a nil schema.
func (s *Schema) tokens() int64 {
	if s == nil {
		return 0
	}
	b, _ := json.Marshal(s.JSON) // Built from plain maps; it marshals.
	return toolOverhead + int64(len(s.Name)+len(s.Description)+len(b))
}

// StructuredModel is a Model that can constrain its reply to a JSON schema:
// OpenAI with response_format json_schema, Anthropic with a forced tool
// whose input is the document. Either way the document is the reply's
// Content. Like Call, CallStructured is one budgeted model call.
type StructuredModel interface {
	Model
	CallStructured(ctx context.Context, req Request, schema Schema) (Response, error)
}

// StructuredFact is one fact of a structured summary.
type StructuredFact struct {
	Text    string   `json:"text"`
	Sources []string `json:"sources"`
}

// FactsSchema is the schema of a subagent's final fact summary:
// {"facts":[{"text":"...","sources":["..."]}]}.
var FactsSchema = Schema{
	Name:        "fact_summary",
	Description: "The facts the work established, each with the sources (URLs or tool results) that support it.",
	JSON: map[string]any{
		"type": "object",
		"properties": map[string]any{
			"facts": map[string]any{
				"type": "array",
				"items": map[string]any{
					"type": "object",
					"properties": map[string]any{
						"text":    map[string]any{"type": "string"},
						"sources": map[string]any{"type": "array", "items": map[string]any{"type": "string"}},
					},
					"required":             []string{"text", "sources"},
					"additionalProperties": false,
				},
			},
		},
		"required":             []string{"facts"},
		"additionalProperties": false,
	},
}

// CompressInstruction is the user message Compress appends to the
// conversation.
const CompressInstruction = "Compress everything above into the facts it established, each with its sources. " +
	`Answer only with JSON {"facts":[{"text":"...","sources":["..."]}]}.`

// Compressed is the outcome of Compress.
type Compressed struct {
	Facts []StructuredFact
	// Degraded reports that the reply did not parse as a fact summary: Facts
	// then holds one fact with the reply's whole text, so nothing is lost.
	Degraded bool
	Response Response // the model's reply, with its usage for the ledger
}

// Compress asks m for the fact summary of a conversation: req.Messages plus
// CompressInstruction, no tools, output capped by req.MaxTokens (the caller
// reserves for it like any call). A StructuredModel is asked for FactsSchema
// as structured output; any other model (Sim) gets the instruction alone. A
// reply that does not parse degrades to one fact holding its text. It
// returns an error only if the call fails; then usage is unknown, as for
// Model.Call. The agent loop (subagent.Loop) calls it once per task, and
// only for a StructuredModel.
func Compress(ctx context.Context, m Model, req Request) (Compressed, error) {
	req.Messages = append(append([]Message(nil), req.Messages...), Message{Role: RoleUser, Content: CompressInstruction})
	req.Tools = nil
	var resp Response
	var err error
	if sm, ok := m.(StructuredModel); ok {
		resp, err = sm.CallStructured(ctx, req, FactsSchema)
	} else {
		resp, err = m.Call(ctx, req)
	}
	if err != nil {
		return Compressed{}, err
	}
	facts, ok := DecodeFacts(resp.Content)
	if !ok {
		facts = nil
		if text := strings.TrimSpace(resp.Content); text != "" {
			facts = []StructuredFact{{Text: text}}
		}
	}
	return Compressed{Facts: facts, Degraded: !ok, Response: resp}, nil
}

// CompressTokens is the input Compress adds to the conversation's: the
// instruction and the schema, one token per byte plus their margins, as
// InputBound counts. Reserve an input bound of the conversation
// (Estimator.Bound) + CompressTokens + the output cap.
func CompressTokens() int64 {
	return messageBound(Message{Role: RoleUser, Content: CompressInstruction}) + FactsSchema.tokens()
}

// DecodeFacts reads {"facts":[{"text","sources"}]} (optionally in a ```json
// fence), dropping facts without text. It reports false if content is not
// such a document with at least one fact.
func DecodeFacts(content string) ([]StructuredFact, bool) {
	s := strings.TrimSpace(content)
	s = strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(s, "```json"), "```"), "```")
	var doc struct {
		Facts []StructuredFact `json:"facts"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(s)), &doc); err != nil {
		return nil, false
	}
	out := make([]StructuredFact, 0, len(doc.Facts))
	for _, f := range doc.Facts {
		if strings.TrimSpace(f.Text) != "" {
			out = append(out, f)
		}
	}
	return out, len(out) > 0
}
