package main

import (
	"bytes"
	"context"
	"encoding/json"
	"hash/fnv"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"time"

	"github.com/fanout/fanout/subagent/llm"
	"github.com/fanout/fanout/subagent/llm/llmtest"
)

// mock is the OpenAI-compatible provider an arm's workers call: llmtest's
// Server, which answers a call over the key's limits 429 with Retry-After
// (and, where the binary's llmtest sends them, the rate-limit headers),
// behind a front that holds each answered call for its latency; and a
// sampler of the Server's counters.
type mock struct {
	srv   *llmtest.Server
	front *httptest.Server
	// the latency of an answered call is in [min, max], by the request's
	// hash.
	min, max time.Duration

	mu      sync.Mutex
	samples []sample
	stop    chan struct{}
	done    chan struct{}
}

// sample is the mock's counters at one moment.
type sample struct {
	at       time.Time
	answered int   // calls answered 200
	tokens   int64 // their usage
	limited  int   // calls answered 429 by the key's limits
	errors   int   // other error replies
}

// searchTool is the tool the tasks call: the worker's built-in search
// (instant, deterministic).
const searchTool = "search"

// newMock starts a mock accepting key with the key's limits rpm and tpm,
// and starts sampling its counters every every.
func newMock(key string, rpm, tpm int64, latencyMin, latencyMax, every time.Duration) *mock {
	m := &mock{min: latencyMin, max: latencyMax, stop: make(chan struct{}), done: make(chan struct{})}
	m.srv = llmtest.New(llmtest.Config{Provider: llmtest.OpenAI, Key: key, Script: script,
		Limits: llm.RateLimit{RPM: rpm, TPM: tpm}})
	backend := m.srv.Config.Handler
	m.front = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		backend.ServeHTTP(&delayed{ResponseWriter: w, ctx: r.Context(), d: m.latency(body)}, r)
	}))
	m.take()
	go m.sampleEvery(every)
	return m
}

// BaseURL is the workers' OPENAI_BASE_URL.
func (m *mock) BaseURL() string { return m.front.URL + "/v1/" }

// latency is a request's: the same body always waits as long.
func (m *mock) latency(body []byte) time.Duration {
	span := m.max - m.min
	if span <= 0 {
		return m.min
	}
	h := fnv.New64a()
	_, _ = h.Write(body)
	return m.min + time.Duration(h.Sum64()%uint64(span+1))
}

func (m *mock) sampleEvery(every time.Duration) {
	defer close(m.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.take()
		}
	}
}

func (m *mock) take() {
	st := m.srv.Stats()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.samples = append(m.samples, sample{at: time.Now(), answered: st.Requests, tokens: st.Tokens, limited: st.Limited, errors: st.Errors})
}

// close stops the sampler (after a last sample) and the servers, and
// returns the samples.
func (m *mock) close() []sample {
	close(m.stop)
	<-m.done
	m.take()
	m.front.CloseClientConnections()
	m.front.Close()
	m.srv.Close()
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.samples)
}

// script answers like a subagent with a tool: a search on the task's first
// call, a plain answer once the search's result is in the conversation,
// and the facts to the compression call (structured output): three calls
// a task.
func script(r llmtest.Request) llmtest.Reply {
	switch {
	case r.Schema == llm.FactsSchema.Name:
		return llmtest.Reply{Text: `{"facts":[{"text":"the item is in the catalogue","sources":["https://example.test/item"]}]}`}
	case slices.Contains(r.Tools, searchTool) && !hasToolResult(r.Messages):
		args, _ := json.Marshal(map[string]string{"query": "catalogue item"}) // A map of strings always marshals.
		return llmtest.Reply{ToolCalls: []llm.ToolCall{{ID: "call_1", Name: searchTool, Args: args}}}
	default:
		return llmtest.Reply{Text: "The item is in the catalogue (https://example.test/item)."}
	}
}

// hasToolResult reports whether a conversation holds a tool's result.
func hasToolResult(msgs []map[string]any) bool {
	return slices.ContainsFunc(msgs, func(m map[string]any) bool { return m["role"] == "tool" })
}

// delayed holds a 200 reply for its latency (or until the client goes
// away) before its first byte; an error reply (a 429) goes at once, as a
// provider refuses before it works.
type delayed struct {
	http.ResponseWriter
	ctx    context.Context
	d      time.Duration
	waited bool
}

func (w *delayed) wait(code int) {
	if w.waited {
		return
	}
	w.waited = true
	if code != http.StatusOK {
		return
	}
	t := time.NewTimer(w.d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-w.ctx.Done():
	}
}

func (w *delayed) WriteHeader(code int) {
	w.wait(code)
	w.ResponseWriter.WriteHeader(code)
}

func (w *delayed) Write(b []byte) (int, error) {
	w.wait(http.StatusOK)
	return w.ResponseWriter.Write(b)
}

// Flush lets the Server stream through the front.
func (w *delayed) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
