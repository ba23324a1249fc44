package llm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

// AnthropicConfig configures an Anthropic model; default BaseURL
// https://api.anthropic.com.
type AnthropicConfig struct {
	ProviderConfig
}

// Anthropic is a Model on the Anthropic Messages API with tool use, through
// the official client with its own retries off. Safe for concurrent use.
type Anthropic struct {
	c    *caller
	msgs anthropic.MessageService
}

var (
	_ Model           = (*Anthropic)(nil)
	_ StructuredModel = (*Anthropic)(nil)
)

// NewAnthropic returns an Anthropic model. It fails if the key or the default
// model is missing. It reads no environment variables.
func NewAnthropic(cfg AnthropicConfig) (*Anthropic, error) {
	pc, err := cfg.withDefaults("anthropic")
	if err != nil {
		return nil, err
	}
	if pc.BaseURL == "" {
		pc.BaseURL = "https://api.anthropic.com/"
	}
	client := anthropic.NewClient(
		option.WithoutEnvironmentDefaults(), // no ANTHROPIC_* variables, no profiles
		option.WithBaseURL(pc.BaseURL),
		option.WithAPIKey(pc.APIKey),
		option.WithHTTPClient(pc.HTTPClient),
		option.WithMaxRetries(0),
		option.WithMiddleware(errorShapeMiddleware(anthropicErrorShape)), //nolint:bodyclose // the middleware closes what it reads; the SDK closes what it hands on
	)
	return &Anthropic{c: newCaller("anthropic", pc, ParseAnthropicLimits), msgs: client.Messages}, nil
}

// Name implements Model.
func (m *Anthropic) Name() string { return "anthropic" }

// DefaultModel implements DefaultModeler.
func (m *Anthropic) DefaultModel() string { return m.c.cfg.Model }

// Close releases idle connections of the HTTP client.
func (m *Anthropic) Close() { m.c.cfg.HTTPClient.CloseIdleConnections() }

// Call implements Model, with the error contract of OpenAI.Call.
func (m *Anthropic) Call(ctx context.Context, req Request) (Response, error) {
	return m.call(ctx, req, nil)
}

// CallStructured implements StructuredModel with a forced tool named
// schema.Name whose input schema is the schema; the tool input is the
// reply's Content.
func (m *Anthropic) CallStructured(ctx context.Context, req Request, schema Schema) (Response, error) {
	return m.call(ctx, req, &schema)
}

func (m *Anthropic) call(ctx context.Context, req Request, schema *Schema) (Response, error) {
	params := m.params(req, schema)
	return m.c.do(ctx, req, schema.tokens(), func(actx context.Context) (Response, error) {
		// An explicit request timeout also stops the client from refusing
		// large max_tokens without streaming; ctx carries the real bound.
		msg, err := m.msgs.New(actx, params, option.WithRequestTimeout(m.c.cfg.CallTimeout))
		if err != nil {
			return Response{}, m.err(req, err)
		}
		if !msg.JSON.Usage.Valid() {
			return Response{}, fmt.Errorf("anthropic: run %s: reply has no usage: %w", req.Meta.RunID, ErrMalformedReply)
		}
		u := msg.Usage
		resp := Response{
			Usage: Usage{InputTokens: u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens,
				OutputTokens: u.OutputTokens},
		}
		switch msg.StopReason {
		case anthropic.StopReasonToolUse:
			resp.FinishReason = FinishToolCalls
		case anthropic.StopReasonMaxTokens:
			resp.FinishReason = FinishLength
		default:
			resp.FinishReason = FinishStop
		}
		for _, b := range msg.Content {
			switch b.Type {
			case "text":
				resp.Content += b.Text
			case "tool_use":
				if schema != nil && b.Name == schema.Name {
					resp.Content = string(b.Input) // the structured document
					continue
				}
				args, err := decodeArgs(string(b.Input))
				if err != nil {
					return Response{}, fmt.Errorf("anthropic: run %s: tool call %s input: %w", req.Meta.RunID, b.Name, err)
				}
				resp.ToolCalls = append(resp.ToolCalls, ToolCall{ID: b.ID, Name: b.Name, Args: args})
			}
		}
		if schema != nil && resp.FinishReason == FinishToolCalls && len(resp.ToolCalls) == 0 {
			resp.FinishReason = FinishStop // the forced tool is the answer
		}
		return resp, nil
	})
}

func (m *Anthropic) params(req Request, schema *Schema) anthropic.MessageNewParams {
	model := req.Model
	if model == "" {
		model = m.c.cfg.Model
	}
	p := anthropic.MessageNewParams{
		Model:     anthropic.Model(model),
		MaxTokens: int64(req.MaxTokens),
	}
	// Request.Temperature and Seed are not sent: this API version has no
	// sampling parameters.
	// The API wants alternating turns and every tool result of a turn in the
	// next user message, so consecutive messages of one side are merged.
	add := func(user bool, blocks ...anthropic.ContentBlockParamUnion) {
		if n := len(p.Messages); n > 0 {
			last := &p.Messages[n-1]
			if user && last.OfUser != nil {
				last.OfUser.Content = append(last.OfUser.Content, blocks...)
				return
			}
			if !user && last.OfAssistant != nil {
				last.OfAssistant.Content = append(last.OfAssistant.Content, blocks...)
				return
			}
		}
		if user {
			p.Messages = append(p.Messages, anthropic.NewUserMessage(blocks...))
		} else {
			p.Messages = append(p.Messages, anthropic.NewAssistantMessage(blocks...))
		}
	}
	for _, msg := range req.Messages {
		switch msg.Role {
		case RoleSystem:
			p.System = append(p.System, anthropic.TextBlockParam{Text: msg.Content})
		case RoleUser:
			add(true, anthropic.NewTextBlock(msg.Content))
		case RoleTool:
			add(true, anthropic.NewToolResultBlock(msg.ToolCallID, msg.Content, msg.IsError))
		case RoleAssistant:
			var blocks []anthropic.ContentBlockParamUnion
			if msg.Content != "" {
				blocks = append(blocks, anthropic.NewTextBlock(msg.Content))
			}
			for _, c := range msg.ToolCalls {
				blocks = append(blocks, anthropic.NewToolUseBlock(c.ID, argsOrEmpty(c.Args), c.Name))
			}
			if len(blocks) > 0 {
				add(false, blocks...)
			}
		}
	}
	for _, t := range req.Tools {
		p.Tools = append(p.Tools, anthropic.ToolUnionParam{OfTool: &anthropic.ToolParam{
			Name:        t.Name,
			Description: anthropic.String(t.Description),
			InputSchema: anthropicSchema(toolSchema(t)),
		}})
	}
	if schema != nil {
		is := anthropic.ToolInputSchemaParam{Properties: schema.JSON["properties"]}
		if r, ok := schema.JSON["required"].([]string); ok {
			is.Required = r
		}
		p.Tools = append(p.Tools, anthropic.ToolUnionParam{OfTool: &anthropic.ToolParam{
			Name: schema.Name, Description: anthropic.String(schema.Description), InputSchema: is,
		}})
		p.ToolChoice = anthropic.ToolChoiceParamOfTool(schema.Name)
	}
	return p
}

// err turns a client error into one that is safe to log.
func (m *Anthropic) err(req Request, err error) error {
	var fr *foreignReply
	if errors.As(err, &fr) {
		return m.c.statusError(req.Meta.RunID, fr, "Request-Id")
	}
	var apiErr *anthropic.Error
	if errors.As(err, &apiErr) {
		se := &StatusError{Provider: "anthropic", RunID: req.Meta.RunID, StatusCode: apiErr.StatusCode,
			RequestID: m.c.redact.String(apiErr.RequestID)}
		se.Message = apiErr.Message
		if se.Message == "" {
			se.Message = apiErr.RawJSON()
		}
		se.Message = truncate(m.c.redact.String(se.Message), 300)
		if apiErr.Response != nil {
			se.RetryAfter = ParseRetryAfter(apiErr.Response.Header, time.Now())
			if se.RequestID == "" {
				se.RequestID = m.c.redact.String(apiErr.Response.Header.Get("Request-Id"))
			}
		}
		return se
	}
	return clientErr("anthropic", req.Meta.RunID, m.c.redact, err)
}

// anthropicSchema is a JSON schema object as the SDK's input_schema: its
// properties and required list in their fields, every other keyword
// ($defs, additionalProperties...) kept as an extra field.
func anthropicSchema(s map[string]any) anthropic.ToolInputSchemaParam {
	is := anthropic.ToolInputSchemaParam{Properties: s["properties"], ExtraFields: map[string]any{}}
	if req, ok := s["required"].([]any); ok {
		for _, r := range req {
			if name, ok := r.(string); ok {
				is.Required = append(is.Required, name)
			}
		}
	}
	for k, v := range s {
		switch k {
		case "type", "properties", "required":
		default:
			is.ExtraFields[k] = v
		}
	}
	return is
}
