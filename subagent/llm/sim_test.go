package llm_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/fanout/fanout/subagent/llm"
)

var tools = []llm.ToolDef{
	{Name: "search", Schema: stringSchema("query", "q")},
	{Name: "fetch", Schema: stringSchema("url", "u")},
}

// stringSchema is the schema of an object with one required string.
func stringSchema(name, desc string) json.RawMessage {
	return json.RawMessage(`{"type":"object","properties":{"` + name + `":{"type":"string","description":"` + desc + `"}},"required":["` + name + `"]}`)
}

func request(task string, it int) llm.Request {
	return llm.Request{
		Messages:  []llm.Message{{Role: llm.RoleUser, Content: "find things about " + task}},
		Tools:     tools,
		MaxTokens: 1000,
		Meta:      llm.Meta{RunID: "r1", TaskID: task, Iteration: it, ReservationID: int64(it)},
	}
}

func TestSimDeterministic(t *testing.T) {
	t.Parallel()
	cfg := llm.SimConfig{ToolCallsPerIteration: 2, FinishAfter: 2, Facts: 2, Seed: 7, InputTokens: 100, OutputTokens: 50}
	a, _ := llm.NewSim(cfg)
	b, _ := llm.NewSim(cfg)
	for it := 1; it <= 2; it++ {
		ra, err := a.Call(t.Context(), request("t1", it))
		if err != nil {
			t.Fatal(err)
		}
		req := request("t1", it)
		req.Meta.RunID = "another run" // the run id must not change the output
		rb, err := b.Call(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(ra, rb) {
			t.Errorf("iteration %d: same seed gave %+v and %+v", it, ra, rb)
		}
		if ra.Usage != (llm.Usage{InputTokens: 100, OutputTokens: 50}) {
			t.Errorf("usage = %+v", ra.Usage)
		}
		switch it {
		case 1:
			if len(ra.ToolCalls) != 2 || ra.FinishReason != llm.FinishToolCalls {
				t.Errorf("iteration 1 = %+v, want 2 tool calls", ra)
			}
		case 2:
			if len(ra.ToolCalls) != 0 || ra.Content == "" || ra.FinishReason != llm.FinishStop {
				t.Errorf("iteration 2 = %+v, want a final answer", ra)
			}
		}
	}
	other, _ := llm.NewSim(llm.SimConfig{Seed: 8, FinishAfter: 1})
	ra, _ := a.Call(t.Context(), request("t1", 2))
	rc, _ := other.Call(t.Context(), request("t1", 2))
	if ra.Content == rc.Content {
		t.Errorf("seeds 7 and 8 gave the same answer %s", ra.Content)
	}
}

func TestSimCapsOutputAtMaxTokens(t *testing.T) {
	t.Parallel()
	s, _ := llm.NewSim(llm.SimConfig{OutputTokens: 500, FinishAfter: 1})
	req := request("t1", 1)
	req.MaxTokens = 20
	resp, err := s.Call(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Usage.OutputTokens != 20 || resp.FinishReason != llm.FinishLength {
		t.Errorf("got usage %+v finish %s, want 20 output tokens and length", resp.Usage, resp.FinishReason)
	}
}

func TestSimCancelReturnsCausePromptly(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "calls.jsonl")
	s, err := llm.NewSim(llm.SimConfig{Latency: time.Hour, LogPath: path})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	cause := errors.New("the cause")
	ctx, cancel := context.WithCancelCause(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := s.Call(ctx, request("t1", 1))
		errc <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for len(s.Calls()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("call never started")
		}
		time.Sleep(time.Millisecond) // poll with a deadline
	}
	cancel(cause)
	select {
	case err := <-errc:
		if !errors.Is(err, cause) {
			t.Errorf("err = %v, want the cancel cause", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancelled call did not return")
	}
	calls := s.Calls()
	if len(calls) != 1 || !calls[0].Cancelled || calls[0].End.IsZero() || calls[0].ReservationID != 1 {
		t.Errorf("log = %+v, want one cancelled call of reservation 1", calls)
	}
	fromFile, err := llm.ReadCallLog(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(fromFile) != 1 || !fromFile[0].Cancelled || fromFile[0].TaskID != "t1" {
		t.Errorf("file log = %+v", fromFile)
	}
}

func TestSimFailEvery(t *testing.T) {
	t.Parallel()
	s, _ := llm.NewSim(llm.SimConfig{FailEvery: 2, FinishAfter: 5})
	if _, err := s.Call(t.Context(), request("t1", 1)); err != nil {
		t.Errorf("iteration 1: %v", err)
	}
	if _, err := s.Call(t.Context(), request("t1", 2)); !errors.Is(err, llm.ErrSimFailure) {
		t.Errorf("iteration 2: err = %v, want ErrSimFailure", err)
	}
}

// TestSimWorstCaseTokens checks the worst-case tokenizer byte by byte on
// multibyte text: 8 + 16 framing tokens per message and tool call or
// definition, one token per byte of everything else.
func TestSimWorstCaseTokens(t *testing.T) {
	t.Parallel()
	s, _ := llm.NewSim(llm.SimConfig{WorstCaseTokens: true, ToolCallsPerIteration: 1, FinishAfter: 2, InputTokens: 1, OutputTokens: 1})
	req := request("t1", 1)
	req.Messages[0].Content = "日本語のテキスト" // 8 runes, 24 bytes
	req.Tools = []llm.ToolDef{{Name: "search", Description: "d", Schema: stringSchema("query", "q")}}
	resp, err := s.Call(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	schema := `{"properties":{"query":{"description":"q","type":"string"}},"required":["query"],"type":"object"}`
	wantIn := int64(8 + 24 + 16 + len("search") + len("d") + len(schema))
	c := resp.ToolCalls
	if len(c) != 1 {
		t.Fatalf("reply %+v, want one tool call", resp)
	}
	args := c[0].Args
	wantOut := int64(len(c[0].ID) + len(c[0].Name) + len(args))
	if resp.Usage != (llm.Usage{InputTokens: wantIn, OutputTokens: wantOut}) {
		t.Errorf("usage %+v, want %d in, %d out", resp.Usage, wantIn, wantOut)
	}

	// A final answer longer than MaxTokens is cut there, never inside a rune.
	req.Meta.Iteration = 2
	req.Messages[0].Content = strings.Repeat("é", 100) // the answer quotes it
	req.MaxTokens = 52                                 // byte 52 is inside an é
	resp, err = s.Call(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.FinishReason != llm.FinishLength || resp.Usage.OutputTokens != 52 || len(resp.Content) > 52 ||
		!utf8.ValidString(resp.Content) || len(resp.ToolCalls) != 0 {
		t.Errorf("cut reply %+v (%d bytes), want at most 52 bytes of valid text, 52 output tokens, finish length",
			resp, len(resp.Content))
	}
}

func TestInputBoundCountsEveryByte(t *testing.T) {
	t.Parallel()
	msgs := []llm.Message{{Role: llm.RoleUser, Content: string(make([]byte, 3000))}}
	if got := llm.InputBound(msgs); got < 3000 {
		t.Errorf("InputBound(3000 bytes) = %d, want >= 3000", got)
	}
	if llm.InputBound(msgs, tools...) <= llm.InputBound(msgs) {
		t.Error("tool definitions add nothing to the bound")
	}
	if llm.InputBound(nil) != 0 {
		t.Error("InputBound(nil) != 0")
	}
	// Multibyte text: one token per byte, not per rune, plus 8 per message.
	for _, text := range []string{"日本語", "🐘🐘", "é", "naïve café"} {
		got := llm.InputBound([]llm.Message{{Role: llm.RoleUser, Content: text}})
		if want := int64(8 + len(text)); got != want {
			t.Errorf("InputBound(%q, %d bytes, %d runes) = %d, want %d", text, len(text), utf8.RuneCountInString(text), got, want)
		}
	}
	// Tool calls: id, name and JSON arguments, plus 16.
	call := llm.Message{Role: llm.RoleAssistant, ToolCalls: []llm.ToolCall{{ID: "c1", Name: "search", Args: json.RawMessage(`{"query":"東京"}`)}}}
	if got, want := llm.InputBound([]llm.Message{call}), int64(8+16+len("c1")+len("search")+len(`{"query":"東京"}`)); got != want {
		t.Errorf("InputBound(tool call) = %d, want %d", got, want)
	}
}

// TestEstimator checks the bound of a growing conversation in multibyte
// text: the recorded usage, plus every byte appended since, plus margins.
func TestEstimator(t *testing.T) {
	t.Parallel()
	conv := []llm.Message{
		{Role: llm.RoleSystem, Content: "あなたはリサーチのサブエージェントです。"},
		{Role: llm.RoleUser, Content: "東京リージョンの料金を調べて 🐘"},
	}
	var e llm.Estimator
	if got, want := e.Bound(conv, tools...), llm.InputBound(conv, tools...); got != want {
		t.Fatalf("first call: Bound = %d, want InputBound %d", got, want)
	}
	e.Record(len(conv), llm.Usage{InputTokens: 40, OutputTokens: 25})
	completion := llm.Message{Role: llm.RoleAssistant, ToolCalls: []llm.ToolCall{
		{ID: "c1", Name: "search", Args: json.RawMessage(`{"query":"料金"}`)},
		{ID: "c2", Name: "fetch", Args: json.RawMessage(`{"url":"https://example.jp/料金"}`)},
	}}
	results := []llm.Message{
		{Role: llm.RoleTool, ToolCallID: "c1", Content: "1. 料金表 (https://example.jp/料金)"},
		{Role: llm.RoleTool, ToolCallID: "c2", Content: "月額 ¥12,000 から"},
	}
	conv = append(conv, completion)
	conv = append(conv, results...)
	// 40+25 reported; the completion's framing (8 + 16 per call); each
	// result's bytes and call id plus 8.
	want := int64(40+25) + 8 + 2*16
	for _, r := range results {
		want += int64(8 + len(r.Content) + len(r.ToolCallID))
	}
	if got := e.Bound(conv, tools...); got != want {
		t.Errorf("second call: Bound = %d, want %d", got, want)
	}
	if e.Bound(conv, tools...) >= llm.InputBound(conv, tools...) {
		t.Error("the recorded usage made the bound no tighter than counting every byte")
	}
	// Nothing appended since (a retry of the same prompt): the usage alone.
	if got := e.Bound(conv[:2], tools...); got != 65 {
		t.Errorf("same prompt again: Bound = %d, want the 65 reported", got)
	}
	// A provider that reported no usage: every byte again.
	e.Record(len(conv), llm.Usage{})
	if got, want := e.Bound(conv, tools...), llm.InputBound(conv, tools...); got != want {
		t.Errorf("after a call without usage: Bound = %d, want InputBound %d", got, want)
	}
	// A conversation shorter than the recorded prompt is not the same one.
	e.Record(len(conv), llm.Usage{InputTokens: 10, OutputTokens: 1})
	if got, want := e.Bound(conv[:1]), llm.InputBound(conv[:1]); got != want {
		t.Errorf("shorter conversation: Bound = %d, want InputBound %d", got, want)
	}
}
