package llm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// ErrSimFailure is the error of a Sim call that SimConfig.FailEvery makes fail.
var ErrSimFailure = errors.New("sim: injected model failure")

// SimConfig tunes a Sim. Zero values take the documented defaults.
type SimConfig struct {
	Latency               time.Duration // how long each call takes; default 0
	InputTokens           int           // input usage reported per call; default about one token per 4 bytes of the request (see typicalInput)
	OutputTokens          int           // output usage per call, capped at MaxTokens; default 64
	ToolCallsPerIteration int           // tool calls per non-final iteration (only if the request offers tools); default 0
	FinishAfter           int           // iterations 1..FinishAfter-1 call tools, iteration FinishAfter answers; default 2
	Facts                 int           // facts in the final answer; default 3
	Seed                  int64         // default seed; a request's non-zero Seed wins
	FailEvery             int           // if > 0, calls whose iteration is a multiple of it fail with ErrSimFailure
	LogPath               string        // if set, every finished call is appended to this file as a JSON line
	// WorstCaseTokens reports the usage of a tokenizer that makes one token
	// of every byte, the most a byte-level BPE tokenizer can bill, instead
	// of InputTokens and OutputTokens: input is one token per byte of the
	// request's message contents, tool call ids, names and JSON arguments
	// and tool definitions' names, descriptions and JSON schemas, plus 8
	// tokens of framing per message and 16 per tool call and tool
	// definition; output is one token per byte of the completion's text or
	// of its tool calls' ids, names and JSON arguments. A completion longer
	// than MaxTokens is cut to MaxTokens bytes of text (no tool calls),
	// finish reason length.
	WorstCaseTokens bool
}

// CallRecord is one entry of a Sim's call log.
type CallRecord struct {
	Start         time.Time
	End           time.Time // zero while the call runs
	RunID         string
	TaskID        string
	Iteration     int
	ReservationID int64
	Cancelled     bool // ended by its context
	Failed        bool // ended by an injected failure
	Usage         Usage
}

// Sim is a deterministic Model. Its output depends only on the seed, the task
// id, the iteration and the request (never on the run id, the clock or the
// order of calls), so the same spec with the same seed plays out the same way.
// It keeps a log of every call for tests. It is not a StructuredModel, so
// the agent loop makes no compression call with it: its final answer is
// already a fact summary. Safe for concurrent use.
type Sim struct {
	cfg SimConfig

	mu   sync.Mutex
	log  []CallRecord
	sink *os.File
}

var _ Model = (*Sim)(nil)

// NewSim returns a Sim. It fails only if cfg.LogPath cannot be opened.
func NewSim(cfg SimConfig) (*Sim, error) {
	if cfg.OutputTokens <= 0 {
		cfg.OutputTokens = 64
	}
	if cfg.FinishAfter <= 0 {
		cfg.FinishAfter = 2
	}
	if cfg.Facts <= 0 {
		cfg.Facts = 3
	}
	s := &Sim{cfg: cfg}
	if cfg.LogPath != "" {
		f, err := os.OpenFile(cfg.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("open sim call log: %w", err)
		}
		s.sink = f
	}
	return s, nil
}

// Close closes the log file, if any.
func (s *Sim) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sink == nil {
		return nil
	}
	err := s.sink.Close()
	s.sink = nil
	return err
}

// Name implements Model.
func (s *Sim) Name() string { return "sim" }

// DefaultModel implements DefaultModeler.
func (s *Sim) DefaultModel() string { return "sim" }

// Calls returns a copy of the call log, in start order.
func (s *Sim) Calls() []CallRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]CallRecord(nil), s.log...)
}

// Call implements Model. It waits Latency (on a timer) and answers; if ctx
// ends first it returns context.Cause(ctx) at once.
func (s *Sim) Call(ctx context.Context, req Request) (Response, error) {
	idx := s.begin(req.Meta)
	if s.cfg.Latency > 0 {
		t := time.NewTimer(s.cfg.Latency)
		select {
		case <-ctx.Done():
			t.Stop()
			s.end(idx, func(r *CallRecord) { r.Cancelled = true })
			return Response{}, context.Cause(ctx)
		case <-t.C:
		}
	} else if ctx.Err() != nil {
		s.end(idx, func(r *CallRecord) { r.Cancelled = true })
		return Response{}, context.Cause(ctx)
	}
	if s.cfg.FailEvery > 0 && req.Meta.Iteration%s.cfg.FailEvery == 0 {
		s.end(idx, func(r *CallRecord) { r.Failed = true })
		return Response{}, fmt.Errorf("call sim in iteration %d: %w", req.Meta.Iteration, ErrSimFailure)
	}
	resp := s.respond(req)
	s.end(idx, func(r *CallRecord) { r.Usage = resp.Usage })
	return resp, nil
}

func (s *Sim) begin(m Meta) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, CallRecord{
		Start: time.Now(), RunID: m.RunID, TaskID: m.TaskID,
		Iteration: m.Iteration, ReservationID: m.ReservationID,
	})
	return len(s.log) - 1
}

func (s *Sim) end(idx int, f func(*CallRecord)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &s.log[idx]
	f(r)
	r.End = time.Now()
	if s.sink != nil {
		// The log is a test aid: a failed write must not fail the call.
		if b, err := json.Marshal(r); err == nil {
			_, _ = s.sink.Write(append(b, '\n'))
		}
	}
}

func (s *Sim) respond(req Request) Response {
	seed := s.cfg.Seed
	if req.Seed != 0 {
		seed = req.Seed
	}
	usage := Usage{InputTokens: int64(s.cfg.InputTokens), OutputTokens: int64(s.cfg.OutputTokens)}
	if usage.InputTokens <= 0 {
		usage.InputTokens = typicalInput(req)
	}
	if s.cfg.WorstCaseTokens {
		return worstCase(req, s.complete(req, seed, usage, FinishStop))
	}
	finish := FinishStop
	if req.MaxTokens > 0 && usage.OutputTokens > int64(req.MaxTokens) {
		usage.OutputTokens = int64(req.MaxTokens)
		finish = FinishLength
	}
	return s.complete(req, seed, usage, finish)
}

// complete returns the completion of req: tool calls or the final answer.
func (s *Sim) complete(req Request, seed int64, usage Usage, finish FinishReason) Response {
	it := req.Meta.Iteration
	if call, ok := simFanOut(req); ok {
		if finish == FinishStop {
			finish = FinishToolCalls
		}
		return Response{ToolCalls: []ToolCall{call}, Usage: usage, FinishReason: finish}
	}
	tools := withoutFanOut(req.Tools) // fan_out is called as its task says, never at random
	if it < s.cfg.FinishAfter && len(tools) > 0 && s.cfg.ToolCallsPerIteration > 0 {
		calls := make([]ToolCall, s.cfg.ToolCallsPerIteration)
		for k := range calls {
			def := tools[(it*len(calls)+k)%len(tools)]
			g := simArgs{task: req.Meta.TaskID, it: it, k: k, h: hash(seed, req.Meta.TaskID, it, k)}
			calls[k] = ToolCall{ID: fmt.Sprintf("call_%d_%d", it, k), Name: def.Name, Args: g.object(def.Schema)}
		}
		if finish == FinishStop {
			finish = FinishToolCalls
		}
		return Response{ToolCalls: calls, Usage: usage, FinishReason: finish}
	}

	sources := urlsIn(req.Messages)
	topic := simTopic(req.Messages)
	type fact struct {
		Text    string   `json:"text"`
		Sources []string `json:"sources"`
	}
	facts := make([]fact, s.cfg.Facts)
	for k := range facts {
		src := fmt.Sprintf("sim://%s/%d", req.Meta.TaskID, k)
		if len(sources) > 0 {
			src = sources[k%len(sources)]
		}
		facts[k] = fact{
			Text: fmt.Sprintf("fact %d of task %s: on %q, simulated finding %08x", k+1, req.Meta.TaskID, topic,
				hash(seed, req.Meta.TaskID, 0, k)),
			Sources: []string{src},
		}
	}
	texts, srcs := simChildFacts(req.Messages)
	for k, text := range texts {
		facts = append(facts, fact{Text: text, Sources: srcs[k]})
	}
	b, _ := json.Marshal(map[string]any{"facts": facts}) // Plain structs always marshal.
	return Response{Content: string(b), Usage: usage, FinishReason: finish}
}

// typicalInput is the default input usage: what a tokenizer averaging
// about 4 bytes a token bills (3/4 of one token per 3 bytes, plus 8 tokens
// per message and 16 per tool call and tool definition, 3/4 of them too).
func typicalInput(req Request) int64 {
	var n int64
	for _, m := range req.Messages {
		n += 8 + (int64(len(m.Content)+len(m.ToolCallID))+2)/3
		for _, c := range m.ToolCalls {
			n += 16 + (int64(len(c.ID)+len(c.Name)+len(simJSON(c.Args)))+2)/3
		}
	}
	for _, t := range req.Tools {
		n += 16 + (int64(len(t.Name)+len(t.Description)+len(simJSON(toolSchema(t))))+2)/3
	}
	return max(1, n*3/4)
}

// worstCase sets resp's usage as SimConfig.WorstCaseTokens says, cutting
// a completion longer than req.MaxTokens. It counts on its own, not with
// the package's bounds, so that it checks them.
func worstCase(req Request, resp Response) Response {
	var in int
	for _, m := range req.Messages {
		in += 8 + len(m.Content) + len(m.ToolCallID)
		for _, c := range m.ToolCalls {
			in += 16 + len(c.ID) + len(c.Name) + len(simJSON(c.Args))
		}
	}
	for _, t := range req.Tools {
		in += 16 + len(t.Name) + len(t.Description) + len(simJSON(toolSchema(t)))
	}
	out := len(resp.Content)
	for _, c := range resp.ToolCalls {
		out += len(c.ID) + len(c.Name) + len(simJSON(c.Args))
	}
	if req.MaxTokens > 0 && out > req.MaxTokens {
		n := req.MaxTokens
		for n > 0 && n < len(resp.Content) && !utf8.RuneStart(resp.Content[n]) {
			n-- // never split a UTF-8 sequence
		}
		resp.Content = resp.Content[:min(n, len(resp.Content))]
		resp.ToolCalls = nil
		resp.FinishReason = FinishLength
		out = req.MaxTokens // it generated its whole cap
	}
	resp.Usage = Usage{InputTokens: int64(in), OutputTokens: int64(out)}
	return resp
}

func simJSON(v any) string {
	if raw, ok := v.(json.RawMessage); ok {
		return string(raw) // as sent: the bounds count these bytes
	}
	b, _ := json.Marshal(v) // Plain maps and strings always marshal.
	return string(b)
}

// simArgs makes a tool call's arguments from the tool's JSON schema, the
// way a model does: every required property, of its type (an enum's first
// value; one array item, or minItems), recursively. Strings name the
// property, the task and a hash of the call, so calls differ by task,
// iteration and position, and repeat exactly when those repeat.
type simArgs struct {
	task  string
	it, k int
	h     uint64
}

func (g simArgs) object(schema json.RawMessage) json.RawMessage {
	var s map[string]any
	_ = json.Unmarshal(schema, &s)       // A bad schema makes {}.
	b, _ := json.Marshal(g.value("", s)) // Decoded JSON always marshals.
	if len(b) == 0 || b[0] != '{' {
		return json.RawMessage("{}")
	}
	return b
}

func (g simArgs) value(name string, s map[string]any) any {
	if c, ok := s["const"]; ok {
		return c
	}
	if e, ok := s["enum"].([]any); ok && len(e) > 0 {
		return e[0]
	}
	switch simType(s) {
	case "object":
		props, _ := s["properties"].(map[string]any)
		req, _ := s["required"].([]any)
		out := map[string]any{}
		for _, r := range req {
			p, _ := r.(string)
			sub, _ := props[p].(map[string]any)
			out[p] = g.value(p, sub)
		}
		return out
	case "array":
		n := 1
		if m, ok := s["minItems"].(float64); ok && m > 1 {
			n = int(m)
		}
		items, _ := s["items"].(map[string]any)
		out := make([]any, n)
		for i := range out {
			out[i] = g.value(fmt.Sprintf("%s%d", name, i+1), items)
		}
		return out
	case "integer", "number":
		return 1 + g.h%9
	case "boolean":
		return true
	case "null":
		return nil
	}
	if name == "url" || s["format"] == "uri" {
		return fmt.Sprintf("https://sim.example/%s/%d/%d", g.task, g.it, g.k)
	}
	return fmt.Sprintf("%s %s %x", name, g.task, g.h%0xffff)
}

// simType is a schema's type: the first non-null of a list, object if it
// has properties, else string.
func simType(s map[string]any) string {
	switch t := s["type"].(type) {
	case string:
		return t
	case []any:
		for _, v := range t {
			if v, ok := v.(string); ok && v != "null" {
				return v
			}
		}
	}
	if _, ok := s["properties"]; ok {
		return "object"
	}
	return "string"
}

// simTopic is the start of the task's instruction (its last user message
// before the work began), so simulated facts read as being about something.
func simTopic(msgs []Message) string {
	topic := ""
	for _, m := range msgs {
		if m.Role == RoleUser && m.Content != CompressInstruction {
			topic = m.Content
		}
		if m.Role == RoleAssistant {
			break
		}
	}
	words := strings.Fields(topic)
	if len(words) > 8 {
		words = append(words[:8], "…")
	}
	return strings.Join(words, " ")
}

var urlPattern = regexp.MustCompile(`https?://[^\s"')\]]+`)

// urlsIn returns the distinct URLs in tool results, sorted.
func urlsIn(msgs []Message) []string {
	seen := map[string]bool{}
	for _, m := range msgs {
		if m.Role != RoleTool {
			continue
		}
		for _, u := range urlPattern.FindAllString(m.Content, -1) {
			seen[u] = true
		}
	}
	out := make([]string, 0, len(seen))
	for u := range seen {
		out = append(out, u)
	}
	sort.Strings(out)
	return out
}

func hash(seed int64, task string, iteration, k int) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d|%s|%d|%d", seed, task, iteration, k)
	return h.Sum64()
}

// ReadCallLog reads a call log written through SimConfig.LogPath, e.g. by a
// worker running in another process.
func ReadCallLog(path string) ([]CallRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read sim call log: %w", err)
	}
	defer func() { _ = f.Close() }()
	var out []CallRecord
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r CallRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("read sim call log line %d: %w", len(out)+1, err)
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read sim call log: %w", err)
	}
	return out, nil
}
