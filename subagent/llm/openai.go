package llm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
)

// OpenAIConfig configures an OpenAI model. BaseURL may name any
// OpenAI-compatible server (OpenAI, vLLM, Ollama, LiteLLM, ...); default
// https://api.openai.com/v1.
type OpenAIConfig struct {
	ProviderConfig
	// Stream asks for a server-sent-event stream with usage in its final
	// chunk (stream_options.include_usage) instead of one JSON reply. A
	// stream that ends before its usage chunk is an error (usage unknown).
	Stream bool
}

// OpenAI is a Model on an OpenAI-compatible chat completions API, through the
// official client with its own retries off: every attempt goes through the
// limits and the RetryPolicy of ProviderConfig. Safe for concurrent use.
type OpenAI struct {
	c      *caller
	stream bool
	chat   openai.ChatCompletionService
}

var (
	_ Model           = (*OpenAI)(nil)
	_ StructuredModel = (*OpenAI)(nil)
)

// NewOpenAI returns an OpenAI model. It fails if the key or the default
// model is missing. It reads no environment variables.
func NewOpenAI(cfg OpenAIConfig) (*OpenAI, error) {
	pc, err := cfg.withDefaults("openai")
	if err != nil {
		return nil, err
	}
	if pc.BaseURL == "" {
		pc.BaseURL = "https://api.openai.com/v1/"
	}
	// NewChatCompletionService, unlike openai.NewClient, reads no OPENAI_*
	// variables: everything comes from cfg.
	chat := openai.NewChatCompletionService(
		option.WithBaseURL(pc.BaseURL),
		option.WithAPIKey(pc.APIKey),
		option.WithHTTPClient(pc.HTTPClient),
		option.WithMaxRetries(0),
		option.WithMiddleware(errorShapeMiddleware(openAIErrorShape)), //nolint:bodyclose // the middleware closes what it reads; the SDK closes what it hands on
	)
	return &OpenAI{c: newCaller("openai", pc, ParseOpenAILimits), stream: cfg.Stream, chat: chat}, nil
}

// Name implements Model.
func (m *OpenAI) Name() string { return "openai" }

// DefaultModel implements DefaultModeler.
func (m *OpenAI) DefaultModel() string { return m.c.cfg.Model }

// Close releases idle connections of the HTTP client.
func (m *OpenAI) Close() { m.c.cfg.HTTPClient.CloseIdleConnections() }

// Call implements Model. Errors name the provider and the run: a
// *StatusError for an error reply (after retries, wrapped in
// ErrRetriesExhausted; at once, and matching ErrMaybeBilled, for a 5xx not
// in the provider's error shape), ErrCallTimeout, ErrMalformedReply, or
// context.Cause(ctx) once ctx ends.
func (m *OpenAI) Call(ctx context.Context, req Request) (Response, error) {
	return m.call(ctx, req, nil)
}

// CallStructured implements StructuredModel with response_format
// json_schema (strict); the reply's Content is the JSON document.
func (m *OpenAI) CallStructured(ctx context.Context, req Request, schema Schema) (Response, error) {
	return m.call(ctx, req, &schema)
}

func (m *OpenAI) call(ctx context.Context, req Request, schema *Schema) (Response, error) {
	params := m.params(req, schema)
	return m.c.do(ctx, req, schema.tokens(), func(actx context.Context) (Response, error) {
		if m.stream {
			return m.callStream(actx, req, params)
		}
		cc, err := m.chat.New(actx, params)
		if err != nil {
			return Response{}, m.err(req, err)
		}
		if len(cc.Choices) == 0 {
			return Response{}, fmt.Errorf("openai: run %s: reply has no choices: %w", req.Meta.RunID, ErrMalformedReply)
		}
		if !cc.JSON.Usage.Valid() {
			return Response{}, fmt.Errorf("openai: run %s: reply has no usage: %w", req.Meta.RunID, ErrMalformedReply)
		}
		msg := cc.Choices[0].Message
		resp := Response{
			Content:      msg.Content,
			Usage:        Usage{InputTokens: cc.Usage.PromptTokens, OutputTokens: cc.Usage.CompletionTokens},
			FinishReason: openAIFinish(cc.Choices[0].FinishReason),
		}
		for _, tc := range msg.ToolCalls {
			args, err := decodeArgs(tc.Function.Arguments)
			if err != nil {
				return Response{}, fmt.Errorf("openai: run %s: tool call %s arguments: %w", req.Meta.RunID, tc.Function.Name, err)
			}
			resp.ToolCalls = append(resp.ToolCalls, ToolCall{ID: tc.ID, Name: tc.Function.Name, Args: args})
		}
		return resp, nil
	})
}

func (m *OpenAI) callStream(ctx context.Context, req Request, params openai.ChatCompletionNewParams) (Response, error) {
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := m.chat.NewStreaming(ctx, params)
	defer func() { _ = stream.Close() }()
	type partial struct {
		id, name, args string
	}
	var (
		resp      Response
		content   []byte
		calls     = map[int64]*partial{}
		gotUsage  bool
		gotFinish bool
	)
	for stream.Next() {
		chunk := stream.Current()
		if chunk.JSON.Usage.Valid() && (chunk.Usage.PromptTokens > 0 || chunk.Usage.CompletionTokens > 0 || len(chunk.Choices) == 0) {
			resp.Usage = Usage{InputTokens: chunk.Usage.PromptTokens, OutputTokens: chunk.Usage.CompletionTokens}
			gotUsage = true
		}
		for _, ch := range chunk.Choices {
			if ch.Index != 0 {
				continue
			}
			content = append(content, ch.Delta.Content...)
			for _, tc := range ch.Delta.ToolCalls {
				p := calls[tc.Index]
				if p == nil {
					p = &partial{}
					calls[tc.Index] = p
				}
				if tc.ID != "" {
					p.id = tc.ID
				}
				if tc.Function.Name != "" {
					p.name = tc.Function.Name
				}
				p.args += tc.Function.Arguments
			}
			if ch.FinishReason != "" {
				resp.FinishReason = openAIFinish(string(ch.FinishReason))
				gotFinish = true
			}
		}
	}
	if err := stream.Err(); err != nil {
		return Response{}, m.err(req, err)
	}
	if !gotFinish || !gotUsage {
		return Response{}, fmt.Errorf("openai: run %s: stream ended before its finish reason and usage (finish %t, usage %t): %w",
			req.Meta.RunID, gotFinish, gotUsage, ErrMalformedReply)
	}
	resp.Content = string(content)
	idx := make([]int64, 0, len(calls))
	for i := range calls {
		idx = append(idx, i)
	}
	sort.Slice(idx, func(a, b int) bool { return idx[a] < idx[b] })
	for _, i := range idx {
		p := calls[i]
		args, err := decodeArgs(p.args)
		if err != nil {
			return Response{}, fmt.Errorf("openai: run %s: tool call %s arguments: %w", req.Meta.RunID, p.name, err)
		}
		resp.ToolCalls = append(resp.ToolCalls, ToolCall{ID: p.id, Name: p.name, Args: args})
	}
	return resp, nil
}

func (m *OpenAI) params(req Request, schema *Schema) openai.ChatCompletionNewParams {
	model := req.Model
	if model == "" {
		model = m.c.cfg.Model
	}
	p := openai.ChatCompletionNewParams{
		Model:               shared.ChatModel(model),
		MaxCompletionTokens: openai.Int(int64(req.MaxTokens)),
	}
	// 0 means the provider's default: reasoning models refuse any other
	// temperature than their own.
	if req.Temperature != 0 {
		p.Temperature = openai.Float(req.Temperature)
	}
	if req.Seed != 0 {
		p.Seed = openai.Int(req.Seed)
	}
	for _, msg := range req.Messages {
		switch msg.Role {
		case RoleSystem:
			p.Messages = append(p.Messages, openai.SystemMessage(msg.Content))
		case RoleUser:
			p.Messages = append(p.Messages, openai.UserMessage(msg.Content))
		case RoleTool:
			p.Messages = append(p.Messages, openai.ToolMessage(msg.Content, msg.ToolCallID))
		case RoleAssistant:
			a := &openai.ChatCompletionAssistantMessageParam{}
			if msg.Content != "" {
				a.Content.OfString = openai.String(msg.Content)
			}
			for _, c := range msg.ToolCalls {
				a.ToolCalls = append(a.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
					OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
						ID:       c.ID,
						Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: c.Name, Arguments: string(argsOrEmpty(c.Args))},
					}})
			}
			p.Messages = append(p.Messages, openai.ChatCompletionMessageParamUnion{OfAssistant: a})
		}
	}
	for _, t := range req.Tools {
		p.Tools = append(p.Tools, openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name:        t.Name,
			Description: openai.String(t.Description),
			Parameters:  shared.FunctionParameters(toolSchema(t)),
		}))
	}
	if schema != nil {
		p.ResponseFormat = openai.ChatCompletionNewParamsResponseFormatUnion{
			OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{
				Name:        schema.Name,
				Description: openai.String(schema.Description),
				Strict:      openai.Bool(true),
				Schema:      schema.JSON,
			}},
		}
	}
	return p
}

// err turns a client error into one that is safe to log: no request, no
// headers, the key redacted.
func (m *OpenAI) err(req Request, err error) error {
	var fr *foreignReply
	if errors.As(err, &fr) {
		return m.c.statusError(req.Meta.RunID, fr, "X-Request-Id")
	}
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		se := &StatusError{Provider: "openai", RunID: req.Meta.RunID, StatusCode: apiErr.StatusCode}
		se.Message = apiErr.Message
		if se.Message == "" {
			se.Message = apiErr.RawJSON()
		}
		se.Message = truncate(m.c.redact.String(se.Message), 300)
		if apiErr.Response != nil {
			se.RequestID = m.c.redact.String(apiErr.Response.Header.Get("X-Request-Id"))
			se.RetryAfter = ParseRetryAfter(apiErr.Response.Header, time.Now())
		}
		return se
	}
	return clientErr("openai", req.Meta.RunID, m.c.redact, err)
}

// clientErr rewrites a transport or decoding error of an official client.
// The original is not wrapped: it may hold the request and its headers.
func clientErr(provider, runID string, r redactor, err error) error {
	msg := truncate(r.String(err.Error()), 300)
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn), errors.As(err, &typ):
		return fmt.Errorf("%s: run %s: decode reply: %s: %w", provider, runID, msg, ErrMalformedReply)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return fmt.Errorf("%s: run %s: reply cut off: %s: %w", provider, runID, msg, ErrMalformedReply)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: run %s: %s: %w", provider, runID, msg, context.DeadlineExceeded)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%s: run %s: %s: %w", provider, runID, msg, context.Canceled)
	}
	return fmt.Errorf("%s: run %s: %s", provider, runID, msg)
}

func openAIFinish(s string) FinishReason {
	switch s {
	case "tool_calls", "function_call":
		return FinishToolCalls
	case "length":
		return FinishLength
	default:
		return FinishStop
	}
}

// toolSchema is a tool's JSON schema as a map (the SDKs' parameter types
// are maps). A schema that is not a JSON object, which Tools never holds,
// is sent as an object without properties.
func toolSchema(t ToolDef) map[string]any {
	var s map[string]any
	if len(t.Schema) > 0 {
		_ = json.Unmarshal(t.Schema, &s) // checked when the tool was registered
	}
	if s == nil {
		s = map[string]any{}
	}
	if _, ok := s["type"]; !ok {
		s["type"] = "object"
	}
	if _, ok := s["properties"]; !ok {
		s["properties"] = map[string]any{}
	}
	return s
}

// decodeArgs checks that a tool call's arguments are one JSON object and
// returns them as the model wrote them; none at all is {}.
func decodeArgs(s string) (json.RawMessage, error) {
	if strings.TrimSpace(s) == "" {
		return json.RawMessage("{}"), nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &obj); err != nil || obj == nil {
		return nil, fmt.Errorf("decode %q: not a JSON object: %w", truncate(s, 100), ErrMalformedReply)
	}
	return json.RawMessage(s), nil
}

// argsOrEmpty is a call's arguments to send back to the provider: {} for
// none.
func argsOrEmpty(a json.RawMessage) json.RawMessage {
	if len(a) == 0 {
		return json.RawMessage("{}")
	}
	return a
}
