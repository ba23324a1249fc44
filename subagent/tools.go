package subagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/subagent/llm"
)

// Effect says whether a tool changes the world. The loop runs reads in
// parallel and writes one at a time, each with an idempotency key and a
// tool_call row. The zero value is a write: a tool nobody declared a read
// is never run in parallel or re-sent (docs/mcp.md#effects).
type Effect int

// The tool effects.
const (
	EffectWrite Effect = iota
	EffectRead
)

func (e Effect) String() string {
	if e == EffectRead {
		return "read"
	}
	return "write"
}

// ToolCall is one invocation of a tool by the agent loop.
type ToolCall struct {
	Name string
	// Args is the JSON object of arguments the model sent, as it sent it.
	Args json.RawMessage
	// IdempotencyKey is set for write tools: the same key must produce the
	// effect once and return the first result on a replay.
	IdempotencyKey string
}

// ToolResult is what a tool returns to the model.
type ToolResult struct {
	Text    string
	Sources []string // where the text came from (URLs, document ids)
	// IsError says the tool ran and reported a failure (MCP's isError):
	// Text is shown to the model as that failure.
	IsError bool
}

// ErrNotSent wraps a tool error that proves the call never reached the
// tool (a slot or rate wait that ended, a session that could not be
// opened): a write refused so is failed, not "may have happened".
var ErrNotSent = errors.New("tool call not sent")

// ToolFunc runs a tool. It must honour ctx: when ctx ends it returns
// promptly, and an error wrapping ErrNotSent if the call was never sent.
type ToolFunc func(ctx context.Context, call ToolCall) (ToolResult, error)

// Tool is one tool a subagent may call.
type Tool struct {
	Name        string // model-facing, ^[a-zA-Z0-9_-]{1,64}$
	Description string
	Effect      Effect
	// Schema is the JSON Schema of the arguments object; nil means an
	// object with no declared properties.
	Schema json.RawMessage
	// Server names the MCP server the tool is on, "" for a built-in: the
	// tool_call rows and telemetry carry it.
	Server string
	// Timeout bounds one call (capped by the task's deadline); its expiry
	// is the call's result. 0 takes the loop's default.
	Timeout time.Duration
	// CacheTTL, for a read, is how long its results may answer the same
	// call of the same tenant's runs that opted in (Task.CacheTools;
	// docs/mcp.md#the-result-cache-for-read-tools): at most runs.MaxCacheTTL; 0 never.
	// A write is never answered from the cache, whatever this says.
	CacheTTL time.Duration
	Func     ToolFunc
	// answered: the call's tool_call row is resolved by the orchestrator,
	// not by the tool's return (fan_out, whose row the child run's end
	// answers); the call holds no tool slot while it waits.
	answered bool
}

// Tools is a registry of tools by name. It is immutable once built and safe
// for concurrent use.
type Tools struct {
	byName map[string]Tool
}

// NewTools returns a registry of tools. It fails on a duplicate or empty
// name or a tool without a Func.
func NewTools(tools ...Tool) (*Tools, error) {
	t := &Tools{byName: make(map[string]Tool, len(tools))}
	for _, tool := range tools {
		switch {
		case !toolName.MatchString(tool.Name):
			return nil, fmt.Errorf("register tool %q: the name must match %s (the providers' limit)", tool.Name, toolName)
		case tool.Effect != EffectRead && tool.Effect != EffectWrite:
			return nil, fmt.Errorf("register tool %s: effect %d is neither read nor write", tool.Name, tool.Effect)
		case len(tool.Schema) > 0 && !isJSONObject(tool.Schema):
			return nil, fmt.Errorf("register tool %s: the schema is not a JSON object", tool.Name)
		case tool.Func == nil:
			return nil, fmt.Errorf("register tool %s: no Func", tool.Name)
		case tool.CacheTTL < 0 || tool.CacheTTL > runs.MaxCacheTTL:
			return nil, fmt.Errorf("register tool %s: cache TTL %s is not 0 to %s", tool.Name, tool.CacheTTL, runs.MaxCacheTTL)
		case t.byName[tool.Name].Name != "":
			return nil, fmt.Errorf("register tool %s: duplicate name", tool.Name)
		}
		t.byName[tool.Name] = tool
	}
	return t, nil
}

// toolName is what both providers accept as a tool's name.
var toolName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

func isJSONObject(b json.RawMessage) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(b, &m) == nil && m != nil
}

// With returns a new registry of t's tools and more, checked as NewTools
// checks them (a name of more that t already has is a duplicate).
func (t *Tools) With(more ...Tool) (*Tools, error) {
	all := make([]Tool, 0, len(t.byName)+len(more))
	for _, tool := range t.byName {
		all = append(all, tool)
	}
	return NewTools(append(all, more...)...)
}

// Known reports whether the registry has a tool called name.
func (t *Tools) Known(name string) bool {
	_, ok := t.byName[name]
	return ok
}

// Get returns the tool called name.
func (t *Tools) Get(name string) (Tool, bool) {
	tool, ok := t.byName[name]
	return tool, ok
}

// Defs returns the model-facing definitions of the allowed tools that exist,
// in the order given.
func (t *Tools) Defs(allowed []string) []llm.ToolDef {
	defs := make([]llm.ToolDef, 0, len(allowed))
	for _, name := range allowed {
		if tool, ok := t.byName[name]; ok {
			defs = append(defs, llm.ToolDef{Name: tool.Name, Description: tool.Description, Schema: tool.Schema})
		}
	}
	return defs
}

// BuiltinToolNames returns the names of the tools BuiltinTools registers,
// sorted. The orchestrator validates TaskSpec.allowed_tools against it.
func BuiltinToolNames() []string { return []string{"fetch", "note", "search"} }

// BuiltinTools returns a fresh registry of the demo tools: search and fetch
// (reads with deterministic fake results) and note (a write kept in memory,
// idempotent by key). Each call returns a new note store.
func BuiltinTools() *Tools {
	notes := &noteStore{byKey: map[string]ToolResult{}}
	t, err := NewTools(
		Tool{
			Name:        "search",
			Description: "Search the web. Returns result snippets with their URLs.",
			Effect:      EffectRead,
			Schema:      stringArgs("query", "what to search for"),
			Func:        search,
		},
		Tool{
			Name:        "fetch",
			Description: "Fetch a web page by URL and return its text.",
			Effect:      EffectRead,
			Schema:      stringArgs("url", "the page to fetch"),
			Func:        fetch,
		},
		Tool{
			Name:        "note",
			Description: "Save a note for later. Returns the note's number.",
			Effect:      EffectWrite,
			Schema:      stringArgs("text", "the note"),
			Func:        notes.write,
		},
	)
	if err != nil {
		panic(err) // The built-in set is fixed; an error here is a bug.
	}
	return t
}

// stringArgs is the schema of an object with one required string argument.
func stringArgs(name, desc string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{ // A map of plain values always marshals.
		"type":       "object",
		"properties": map[string]any{name: map[string]string{"type": "string", "description": desc}},
		"required":   []string{name},
	})
	return b
}

// stringArg returns call's argument name if it is a string, else "".
func stringArg(call ToolCall, name string) string {
	var args map[string]any
	_ = json.Unmarshal(call.Args, &args) // Bad JSON reads as no arguments.
	s, _ := args[name].(string)
	return s
}

func search(ctx context.Context, call ToolCall) (ToolResult, error) {
	if err := context.Cause(ctx); err != nil {
		return ToolResult{}, err
	}
	q := strings.TrimSpace(stringArg(call, "query"))
	if q == "" {
		return ToolResult{}, errors.New("search: argument query is required")
	}
	h := fnv.New32a()
	h.Write([]byte(q))
	slug := fmt.Sprintf("%08x", h.Sum32())
	var b strings.Builder
	var sources []string
	for i := 1; i <= 2; i++ {
		u := fmt.Sprintf("https://search.example/%s/%d", slug, i)
		fmt.Fprintf(&b, "%d. Result %d for %q (%s)\n", i, i, q, u)
		sources = append(sources, u)
	}
	return ToolResult{Text: b.String(), Sources: sources}, nil
}

func fetch(ctx context.Context, call ToolCall) (ToolResult, error) {
	if err := context.Cause(ctx); err != nil {
		return ToolResult{}, err
	}
	u := strings.TrimSpace(stringArg(call, "url"))
	if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
		return ToolResult{}, fmt.Errorf("fetch: argument url must be an http(s) URL, got %q", u)
	}
	return ToolResult{Text: fmt.Sprintf("Contents of %s: a page about %s.", u, u[strings.LastIndex(u, "/")+1:]),
		Sources: []string{u}}, nil
}

// noteStore keeps notes in memory, one per idempotency key.
type noteStore struct {
	mu    sync.Mutex
	byKey map[string]ToolResult
	n     int
}

func (s *noteStore) write(ctx context.Context, call ToolCall) (ToolResult, error) {
	if err := context.Cause(ctx); err != nil {
		return ToolResult{}, err
	}
	if call.IdempotencyKey == "" {
		return ToolResult{}, errors.New("note: idempotency key is required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.byKey[call.IdempotencyKey]; ok {
		return r, nil
	}
	s.n++
	r := ToolResult{Text: fmt.Sprintf("note %d saved: %s", s.n, stringArg(call, "text")),
		Sources: []string{fmt.Sprintf("note:%d", s.n)}}
	s.byKey[call.IdempotencyKey] = r
	return r, nil
}
