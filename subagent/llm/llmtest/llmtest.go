// Package llmtest runs fake model providers that speak the OpenAI chat
// completions and Anthropic messages wire formats, for tests and benchmarks.
package llmtest

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fanout/fanout/subagent/llm"
)

// Providers a Server can speak.
const (
	OpenAI    = "openai"
	Anthropic = "anthropic"
)

// Reply is what the server answers one request with.
type Reply struct {
	Status     int    // if not 0 or 200: an error reply in the provider's format (unless Raw is set)
	RetryAfter string // the Retry-After header of an error reply
	Message    string // the error message of an error reply
	// Raw, if set, is the body, as is, with Status (default 200): a
	// malformed reply, or an error reply that is not in the provider's
	// shape, such as a gateway's HTML page or {"error":"TypeError"}.
	Raw         string
	ContentType string // of a Raw body; default application/json
	Text        string
	ToolCalls   []llm.ToolCall
	Usage       llm.Usage // zero: computed from the request (see Server)
	Hang        bool      // never answer; wait for the client to go away
	CutAfter    int       // streaming: drop the connection after this many chunks
	// Header is set on the reply last, over the rate-limit headers the
	// server states (a test's own or hostile values).
	Header http.Header
}

// Request is what the server saw of one request.
type Request struct {
	N          int  // 1-based arrival number
	AuthOK     bool // the key was in the provider's auth header
	Stream     bool
	MaxTokens  int64
	Model      string
	Messages   []map[string]any
	Tools      []string // tool names offered
	Schema     string   // OpenAI response_format json_schema name
	ForcedTool string   // Anthropic tool_choice {type: tool} name
	Body       map[string]any
}

// Stats counts what the server did.
type Stats struct {
	Requests  int   // answered 200
	Tokens    int64 // usage of the 200 replies
	Limited   int   // answered 429 by the server's own rate limits
	Errors    int   // scripted error replies
	Cancelled int   // requests whose client went away before the reply
}

// Server is a fake provider. Without a Script it answers every request with
// a short text. Usage, unless scripted, is 4 tokens per message plus one per
// 4 bytes of content in, and one per 4 bytes of text plus 10 per tool call
// out, capped at max_tokens: never more than llm.InputBound plus the
// output cap, as with a real tokenizer. Safe for concurrent use.
type Server struct {
	*httptest.Server
	Provider string

	key    string
	script func(Request) Reply
	limits llm.RateLimit

	mu        sync.Mutex
	reqs      []Request
	stats     Stats
	cancelled chan struct{}
	bucketAt  time.Time
	reqBal    float64
	tokBal    float64
}

// Config configures a Server.
type Config struct {
	Provider string // OpenAI or Anthropic
	Key      string // the API key it accepts; others get 401
	// Script returns the reply to a request; nil answers every request
	// with a default text.
	Script func(Request) Reply
	// Limits, if set, are enforced like a provider does: token buckets that
	// start full and refill continuously, holding Burst of a minute's rate;
	// a request over them is answered 429 with Retry-After. Tokens are the
	// request's real usage. Every reply (but a 401) states them in the
	// provider's headers, as the real ones do: x-ratelimit-limit-requests,
	// -tokens, x-ratelimit-remaining-*, x-ratelimit-reset-* (durations such
	// as "1.5s", "20ms") for OpenAI; anthropic-ratelimit-requests-*,
	// -tokens-*, -input-tokens-*, -output-tokens-* (-limit, -remaining,
	// -reset as RFC 3339) for Anthropic. Remaining is what the server's
	// bucket holds, reset when it will be full.
	Limits llm.RateLimit
}

// New starts a Server. Close it when done.
func New(cfg Config) *Server {
	s := &Server{Provider: cfg.Provider, key: cfg.Key, script: cfg.Script, limits: cfg.Limits,
		cancelled: make(chan struct{}, 1024)}
	if s.limits.Burst <= 0 {
		s.limits.Burst = time.Second
	}
	s.bucketAt = time.Now()
	s.reqBal = capacity(s.limits.RPM, s.limits.Burst)
	s.tokBal = capacity(s.limits.TPM, s.limits.Burst)
	s.Server = httptest.NewServer(http.HandlerFunc(s.handle))
	return s
}

// BaseURL is the URL to configure the provider model with.
func (s *Server) BaseURL() string {
	if s.Provider == OpenAI {
		return s.URL + "/v1/"
	}
	return s.URL + "/"
}

// Requests returns what the server saw, in arrival order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// Stats returns the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Cancelled receives once for every request whose client went away (its
// context ended) before the server answered.
func (s *Server) Cancelled() <-chan struct{} { return s.cancelled }

func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		s.writeError(w, http.StatusBadRequest, "", "invalid JSON body")
		return
	}
	req := s.parse(r, body)
	s.mu.Lock()
	req.N = len(s.reqs) + 1
	s.reqs = append(s.reqs, req)
	s.mu.Unlock()

	if !req.AuthOK {
		s.count(func(st *Stats) { st.Errors++ })
		s.writeError(w, http.StatusUnauthorized, "", "invalid x-api-key / bearer token")
		return
	}
	reply := Reply{Text: "fake answer"}
	if s.script != nil {
		reply = s.script(req)
	}
	if reply.Hang {
		<-r.Context().Done()
		s.count(func(st *Stats) { st.Cancelled++ })
		s.cancelled <- struct{}{}
		return
	}
	s.stateLimits(w.Header(), reply)
	if reply.Raw != "" {
		s.writeRaw(w, reply)
		return
	}
	if reply.Status != 0 && reply.Status != http.StatusOK {
		s.count(func(st *Stats) { st.Errors++ })
		s.writeError(w, reply.Status, reply.RetryAfter, reply.Message)
		return
	}
	if reply.Usage == (llm.Usage{}) {
		reply.Usage = usage(req, reply)
	}
	wait, ok := s.admit(reply.Usage.Total())
	s.stateLimits(w.Header(), reply)
	if !ok {
		s.count(func(st *Stats) { st.Limited++ })
		s.writeError(w, http.StatusTooManyRequests, fmt.Sprint(int(math.Ceil(wait.Seconds()))), "rate limit exceeded")
		return
	}
	if s.Provider == OpenAI && req.Stream {
		s.streamOpenAI(w, r, req, reply)
		return
	}
	var out any
	if s.Provider == OpenAI {
		out = openAIReply(req, reply)
	} else {
		out = anthropicReply(req, reply)
	}
	s.count(func(st *Stats) { st.Requests++; st.Tokens += reply.Usage.Total() })
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func (s *Server) count(f func(*Stats)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.stats)
}

func (s *Server) parse(r *http.Request, body map[string]any) Request {
	req := Request{Body: body}
	if s.Provider == OpenAI {
		req.AuthOK = r.Header.Get("Authorization") == "Bearer "+s.key
	} else {
		// The official client sends the key as x-api-key or, in newer
		// versions, as a bearer token; the API takes both.
		req.AuthOK = r.Header.Get("X-Api-Key") == s.key || r.Header.Get("Authorization") == "Bearer "+s.key
	}
	req.Stream, _ = body["stream"].(bool)
	req.Model, _ = body["model"].(string)
	for _, k := range []string{"max_completion_tokens", "max_tokens"} {
		if v, ok := body[k].(float64); ok {
			req.MaxTokens = int64(v)
			break
		}
	}
	if msgs, ok := body["messages"].([]any); ok {
		for _, m := range msgs {
			if mm, ok := m.(map[string]any); ok {
				req.Messages = append(req.Messages, mm)
			}
		}
	}
	if tools, ok := body["tools"].([]any); ok {
		for _, t := range tools {
			tm, _ := t.(map[string]any)
			if f, ok := tm["function"].(map[string]any); ok {
				tm = f
			}
			name, _ := tm["name"].(string)
			req.Tools = append(req.Tools, name)
		}
	}
	if rf, ok := body["response_format"].(map[string]any); ok {
		if js, ok := rf["json_schema"].(map[string]any); ok {
			req.Schema, _ = js["name"].(string)
		}
	}
	if tc, ok := body["tool_choice"].(map[string]any); ok && tc["type"] == "tool" {
		req.ForcedTool, _ = tc["name"].(string)
	}
	return req
}

// admit debits the server's own limits, if any.
func (s *Server) admit(tokens int64) (time.Duration, bool) {
	if s.limits.RPM <= 0 && s.limits.TPM <= 0 {
		return 0, true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	el := now.Sub(s.bucketAt).Minutes()
	s.bucketAt = now
	s.reqBal = min(capacity(s.limits.RPM, s.limits.Burst), s.reqBal+float64(s.limits.RPM)*el)
	s.tokBal = min(capacity(s.limits.TPM, s.limits.Burst), s.tokBal+float64(s.limits.TPM)*el)
	var wait time.Duration
	if s.limits.RPM > 0 && s.reqBal < 1 {
		wait = max(wait, time.Duration((1-s.reqBal)/float64(s.limits.RPM)*float64(time.Minute)))
	}
	if need := min(float64(tokens), capacity(s.limits.TPM, s.limits.Burst)); s.limits.TPM > 0 && s.tokBal < need {
		wait = max(wait, time.Duration((need-s.tokBal)/float64(s.limits.TPM)*float64(time.Minute)))
	}
	if wait > 0 {
		return wait, false
	}
	if s.limits.RPM > 0 {
		s.reqBal--
	}
	if s.limits.TPM > 0 {
		s.tokBal -= float64(tokens)
	}
	return 0, true
}

// stateLimits sets the rate-limit headers of the provider on h: the
// server's limits and its buckets' balances, refilled to now; then
// reply.Header over them.
func (s *Server) stateLimits(h http.Header, reply Reply) {
	if s.limits.RPM > 0 || s.limits.TPM > 0 {
		s.mu.Lock()
		now := time.Now()
		el := now.Sub(s.bucketAt).Minutes()
		reqBal := min(capacity(s.limits.RPM, s.limits.Burst), s.reqBal+float64(s.limits.RPM)*el)
		tokBal := min(capacity(s.limits.TPM, s.limits.Burst), s.tokBal+float64(s.limits.TPM)*el)
		s.mu.Unlock()
		type dim struct {
			limit         int64
			balance       float64
			untilFull     time.Duration
			openAI, anthr []string
		}
		untilFull := func(perMinute int64, balance float64) time.Duration {
			if perMinute <= 0 {
				return 0
			}
			d := (capacity(perMinute, s.limits.Burst) - balance) / float64(perMinute) * float64(time.Minute)
			return time.Duration(max(0, d)).Round(time.Millisecond)
		}
		dims := []dim{
			{limit: s.limits.RPM, balance: reqBal, untilFull: untilFull(s.limits.RPM, reqBal),
				openAI: []string{"requests"}, anthr: []string{"requests"}},
			{limit: s.limits.TPM, balance: tokBal, untilFull: untilFull(s.limits.TPM, tokBal),
				openAI: []string{"tokens"}, anthr: []string{"tokens", "input-tokens", "output-tokens"}},
		}
		for _, d := range dims {
			if d.limit <= 0 {
				continue
			}
			left := strconv.FormatInt(int64(max(0, math.Floor(d.balance))), 10)
			if s.Provider == OpenAI {
				for _, n := range d.openAI {
					h.Set("x-ratelimit-limit-"+n, strconv.FormatInt(d.limit, 10))
					h.Set("x-ratelimit-remaining-"+n, left)
					h.Set("x-ratelimit-reset-"+n, d.untilFull.String())
				}
				continue
			}
			for _, n := range d.anthr {
				h.Set("anthropic-ratelimit-"+n+"-limit", strconv.FormatInt(d.limit, 10))
				h.Set("anthropic-ratelimit-"+n+"-remaining", left)
				h.Set("anthropic-ratelimit-"+n+"-reset", now.Add(d.untilFull).UTC().Format(time.RFC3339))
			}
		}
	}
	for k, vs := range reply.Header {
		h.Del(k)
		for _, v := range vs {
			h.Add(k, v)
		}
	}
}

func capacity(perMinute int64, burst time.Duration) float64 {
	return max(1, float64(perMinute)*burst.Minutes())
}

func usage(req Request, reply Reply) llm.Usage {
	var in int64
	for _, m := range req.Messages {
		in += 4
		switch c := m["content"].(type) {
		case string:
			in += int64(len(c)) / 4
		case []any:
			b, _ := json.Marshal(c)
			in += int64(len(b)) / 8 // blocks: about half of the JSON is text
		}
	}
	out := int64(len(reply.Text))/4 + 1 + 10*int64(len(reply.ToolCalls))
	if req.MaxTokens > 0 {
		out = min(out, req.MaxTokens)
	}
	return llm.Usage{InputTokens: max(1, in), OutputTokens: out}
}

// writeRaw answers reply.Raw as is, with reply.Status.
func (s *Server) writeRaw(w http.ResponseWriter, reply Reply) {
	status := reply.Status
	if status == 0 {
		status = http.StatusOK
	}
	if status != http.StatusOK {
		s.count(func(st *Stats) { st.Errors++ })
	}
	if reply.RetryAfter != "" {
		w.Header().Set("Retry-After", reply.RetryAfter)
	}
	ct := reply.ContentType
	if ct == "" {
		ct = "application/json"
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(status)
	_, _ = w.Write([]byte(reply.Raw))
}

func (s *Server) writeError(w http.ResponseWriter, status int, retryAfter, msg string) {
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.Header().Set("Content-Type", "application/json")
	if msg == "" {
		msg = http.StatusText(status)
	}
	var body any
	kind := "api_error"
	switch status {
	case http.StatusTooManyRequests:
		kind = "rate_limit_error"
	case http.StatusUnauthorized:
		kind = "authentication_error"
	}
	if s.Provider == OpenAI {
		w.Header().Set("X-Request-Id", "req_fake")
		body = map[string]any{"error": map[string]any{"message": msg, "type": kind, "code": nil, "param": nil}}
	} else {
		w.Header().Set("Request-Id", "req_fake")
		body = map[string]any{"type": "error", "error": map[string]any{"type": kind, "message": msg}}
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

func argsJSON(args json.RawMessage) string {
	if len(args) == 0 {
		return "{}"
	}
	return string(args)
}

func openAIFinish(reply Reply) string {
	if len(reply.ToolCalls) > 0 {
		return "tool_calls"
	}
	return "stop"
}

func openAIReply(req Request, reply Reply) any {
	msg := map[string]any{"role": "assistant", "content": nil}
	if reply.Text != "" || len(reply.ToolCalls) == 0 {
		msg["content"] = reply.Text
	}
	if len(reply.ToolCalls) > 0 {
		var calls []any
		for _, c := range reply.ToolCalls {
			calls = append(calls, map[string]any{"id": c.ID, "type": "function",
				"function": map[string]any{"name": c.Name, "arguments": argsJSON(c.Args)}})
		}
		msg["tool_calls"] = calls
	}
	return map[string]any{
		"id": "chatcmpl-fake", "object": "chat.completion", "created": time.Now().Unix(), "model": req.Model,
		"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": openAIFinish(reply), "logprobs": nil}},
		"usage": map[string]any{"prompt_tokens": reply.Usage.InputTokens, "completion_tokens": reply.Usage.OutputTokens,
			"total_tokens": reply.Usage.Total()},
	}
}

// streamOpenAI writes the reply as chat.completion.chunk events: a role
// chunk, the text in pieces, each tool call as a header chunk plus argument
// pieces, a finish chunk, a usage chunk with no choices, and [DONE].
func (s *Server) streamOpenAI(w http.ResponseWriter, r *http.Request, req Request, reply Reply) {
	w.Header().Set("Content-Type", "text/event-stream")
	fl, _ := w.(http.Flusher)
	chunk := func(choices []any, usage any) map[string]any {
		return map[string]any{"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": time.Now().Unix(),
			"model": req.Model, "choices": choices, "usage": usage}
	}
	delta := func(d map[string]any, finish any) []any {
		return []any{map[string]any{"index": 0, "delta": d, "finish_reason": finish}}
	}
	var events []any
	events = append(events, chunk(delta(map[string]any{"role": "assistant", "content": ""}, nil), nil))
	for _, piece := range pieces(reply.Text, 8) {
		events = append(events, chunk(delta(map[string]any{"content": piece}, nil), nil))
	}
	for i, c := range reply.ToolCalls {
		events = append(events, chunk(delta(map[string]any{"tool_calls": []any{map[string]any{"index": i, "id": c.ID,
			"type": "function", "function": map[string]any{"name": c.Name, "arguments": ""}}}}, nil), nil))
		for _, piece := range pieces(argsJSON(c.Args), 5) {
			events = append(events, chunk(delta(map[string]any{"tool_calls": []any{map[string]any{"index": i,
				"function": map[string]any{"arguments": piece}}}}, nil), nil))
		}
	}
	events = append(events, chunk(delta(map[string]any{}, openAIFinish(reply)), nil))
	events = append(events, chunk([]any{}, map[string]any{"prompt_tokens": reply.Usage.InputTokens,
		"completion_tokens": reply.Usage.OutputTokens, "total_tokens": reply.Usage.Total()}))
	for i, e := range events {
		if reply.CutAfter > 0 && i == reply.CutAfter {
			s.count(func(st *Stats) { st.Errors++ })
			panic(http.ErrAbortHandler) // drops the connection mid-stream
		}
		b, _ := json.Marshal(e)
		fmt.Fprintf(w, "data: %s\n\n", b)
		if fl != nil {
			fl.Flush()
		}
		if r.Context().Err() != nil {
			return
		}
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	s.count(func(st *Stats) { st.Requests++; st.Tokens += reply.Usage.Total() })
}

func pieces(s string, n int) []string {
	var out []string
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	if s != "" {
		out = append(out, s)
	}
	return out
}

func anthropicReply(req Request, reply Reply) any {
	var content []any
	stop := "end_turn"
	if req.ForcedTool != "" && strings.HasPrefix(strings.TrimSpace(reply.Text), "{") {
		var input any
		if json.Unmarshal([]byte(reply.Text), &input) == nil {
			content = append(content, map[string]any{"type": "tool_use", "id": "toolu_forced", "name": req.ForcedTool, "input": input})
			stop = "tool_use"
			reply.Text = ""
		}
	}
	if reply.Text != "" {
		content = append(content, map[string]any{"type": "text", "text": reply.Text})
	}
	for _, c := range reply.ToolCalls {
		content = append(content, map[string]any{"type": "tool_use", "id": c.ID, "name": c.Name, "input": json.RawMessage(argsJSON(c.Args))})
		stop = "tool_use"
	}
	if content == nil {
		content = []any{}
	}
	return map[string]any{
		"id": "msg_fake", "type": "message", "role": "assistant", "model": req.Model, "content": content,
		"stop_reason": stop, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": reply.Usage.InputTokens, "output_tokens": reply.Usage.OutputTokens,
			"cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
	}
}
