package subagent_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
	"github.com/fanout/fanout/subagent/llm/llmtest"
)

const (
	localFacts      = `{"facts":[{"text":"local fact","sources":["https://example.com/local"]}]}`
	compressedFacts = `{"facts":[{"text":"compressed fact","sources":["https://example.com/a"]},` +
		`{"text":"second compressed fact","sources":[]}]}`
)

// providerKinds are the structured-output providers the compression tests
// run against.
var providerKinds = []struct {
	name     string
	provider string
	stream   bool
}{{"openai", llmtest.OpenAI, false}, {"openai-stream", llmtest.OpenAI, true}, {"anthropic", llmtest.Anthropic, false}}

// newProviderModel starts a fake provider with script and returns it with a
// real provider model pointed at it.
func newProviderModel(t *testing.T, provider string, stream bool, script func(llmtest.Request) llmtest.Reply) (*llmtest.Server, llm.Model) {
	t.Helper()
	const key = "sk-test-compress"
	srv := llmtest.New(llmtest.Config{Provider: provider, Key: key, Script: script})
	t.Cleanup(srv.Close)
	cfg := llm.ProviderConfig{APIKey: key, BaseURL: srv.BaseURL(), Model: "test-model", CallTimeout: 10 * time.Second,
		Retry: llm.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}}
	if provider == llmtest.OpenAI {
		m, err := llm.NewOpenAI(llm.OpenAIConfig{ProviderConfig: cfg, Stream: stream})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
		return srv, m
	}
	m, err := llm.NewAnthropic(llm.AnthropicConfig{ProviderConfig: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return srv, m
}

// structured reports whether the fake provider was asked for the fact
// summary as structured output.
func structured(r llmtest.Request) bool {
	return r.Schema == llm.FactsSchema.Name || r.ForcedTool == llm.FactsSchema.Name
}

// agentScript answers like a subagent: a search on the first call, the
// final answer localFacts on the second, and compressed to a structured
// request.
func agentScript(compressed llmtest.Reply) func(llmtest.Request) llmtest.Reply {
	return func(r llmtest.Request) llmtest.Reply {
		switch {
		case structured(r):
			return compressed
		case r.N == 1:
			return llmtest.Reply{ToolCalls: []llm.ToolCall{{ID: "call_1", Name: "search", Args: json.RawMessage(`{"query":"go"}`)}}}
		default:
			return llmtest.Reply{Text: localFacts}
		}
	}
}

// checkPaid checks that the task account spent exactly the usage the fake
// provider reported, that the summary says so, and that nothing is held.
func checkPaid(t *testing.T, b *bundle, srv *llmtest.Server, sum subagent.Summary) {
	t.Helper()
	reported := srv.Stats().Tokens
	if spent := b.account(t, "a").Spent; spent != reported || sum.TokensSpent != reported {
		t.Errorf("task account spent %d, summary %d; the provider reported %d", spent, sum.TokensSpent, reported)
	}
	for _, r := range b.reservations(t) {
		if r.State == "settled" && r.Estimated {
			t.Errorf("reservation %+v settled estimated; every call reported its usage", r)
		}
	}
	b.checkLedger(t)
}

func toJSON(v any) string {
	b, _ := json.Marshal(v) // Decoded JSON always marshals.
	return string(b)
}

func hasNote(sum subagent.Summary, part string) bool {
	for _, f := range sum.Failed {
		if strings.Contains(f, part) {
			return true
		}
	}
	return false
}

func TestLoopCompressesWithStructuredOutput(t *testing.T) {
	t.Parallel()
	for _, k := range providerKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
			srv, model := newProviderModel(t, k.provider, k.stream, agentScript(llmtest.Reply{Text: compressedFacts}))
			loop := newLoop(b, model)
			loop.CompressMaxTokens = 300

			sum := loop.Run(t.Context(), newTask(b, "a"))

			if sum.Status != subagent.StatusSucceeded || sum.Err != nil || len(sum.Failed) != 0 {
				t.Fatalf("status %s, err %v, failed %q", sum.Status, sum.Err, sum.Failed)
			}
			if len(sum.Facts) != 2 || sum.Facts[0].Text != "compressed fact" || sum.Facts[0].Sources[0] != "https://example.com/a" ||
				sum.Facts[1].Text != "second compressed fact" {
				t.Errorf("facts %+v, want the compression call's", sum.Facts)
			}
			if sum.Iterations != 2 || len(sum.Tried) != 1 {
				t.Errorf("%d iterations, tried %q; want 2 and one search (compression is no iteration)", sum.Iterations, sum.Tried)
			}
			reqs := srv.Requests()
			if len(reqs) != 3 {
				t.Fatalf("%d requests, want 2 iterations and 1 compression", len(reqs))
			}
			c := reqs[2]
			if !structured(c) || c.MaxTokens != 300 {
				t.Errorf("compression request: schema %q, forced tool %q, max tokens %d; want fact_summary, 300",
					c.Schema, c.ForcedTool, c.MaxTokens)
			}
			if want := map[string]int{llmtest.OpenAI: 0, llmtest.Anthropic: 1}[k.provider]; len(c.Tools) != want {
				t.Errorf("compression request offered tools %q", c.Tools)
			}
			if last := c.Messages[len(c.Messages)-1]; !strings.Contains(strings.ToLower(toJSON(last)), "compress everything above") {
				t.Errorf("compression request ends with %v, want the compress instruction", last)
			}
			if res := b.reservations(t); len(res) != 3 || res[2].State != "settled" || res[2].Actual == nil ||
				*res[2].Actual != srv.Stats().Tokens-*res[0].Actual-*res[1].Actual {
				t.Errorf("reservations %+v: want 3, the last settled with the compression call's usage", res)
			}
			checkPaid(t, b, srv, sum)
		})
	}
}

func TestLoopCompressionDegrades(t *testing.T) {
	t.Parallel()
	for _, k := range providerKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
			const text = "I could not format this, but go has generics."
			srv, model := newProviderModel(t, k.provider, k.stream, agentScript(llmtest.Reply{Text: text}))

			sum := newLoop(b, model).Run(t.Context(), newTask(b, "a"))

			if sum.Status != subagent.StatusSucceeded {
				t.Fatalf("status %s, err %v", sum.Status, sum.Err)
			}
			if len(sum.Facts) != 1 || sum.Facts[0].Text != text {
				t.Errorf("facts %+v, want one holding the reply's text", sum.Facts)
			}
			if len(sum.Failed) != 1 || !hasNote(sum, "not a fact summary") {
				t.Errorf("failed %q, want one note flagging the degraded summary", sum.Failed)
			}
			checkPaid(t, b, srv, sum)
		})
	}
}

// TestLoopCompressionFailureKeepsLocalSummary fails the compression call
// with a refusal in the provider's own error shape: it ran nothing, so it is
// settled at 0, not estimated (docs/ledger.md#reservation-states), and the
// final answer's facts are kept.
func TestLoopCompressionFailureKeepsLocalSummary(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	srv, model := newProviderModel(t, llmtest.OpenAI, false, agentScript(llmtest.Reply{Status: 400, Message: "bad schema"}))

	sum := newLoop(b, model).Run(t.Context(), newTask(b, "a"))

	if sum.Status != subagent.StatusSucceeded || len(sum.Facts) != 1 || sum.Facts[0].Text != "local fact" {
		t.Fatalf("status %s, facts %+v; want SUCCEEDED with the final answer's fact", sum.Status, sum.Facts)
	}
	if !hasNote(sum, "compress: call model openai") || !hasNote(sum, "HTTP 400") {
		t.Errorf("failed %q, want a note on the compression call", sum.Failed)
	}
	res := b.reservations(t)
	if len(res) != 3 || res[2].State != "settled" || res[2].Estimated || res[2].Spent != 0 {
		t.Fatalf("reservations %+v: the refused compression call must be settled at 0, not estimated", res)
	}
	if got := b.account(t, "a").Spent; got != sum.TokensSpent || got != srv.Stats().Tokens {
		t.Errorf("ledger spent %d, summary %d; want what the provider reported, %d", got, sum.TokensSpent, srv.Stats().Tokens)
	}
	b.checkLedger(t)
}

// TestLoopCompressionOverTaskBudget gives the task enough for its answer but
// not for the compression call: its facts come back with a note, and the
// compression call is never made.
func TestLoopCompressionOverTaskBudget(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		limit int64
		iters int // the task's iteration cap
		want  subagent.Status
		fact  string
	}{
		{"answered", 900, 0, subagent.StatusSucceeded, "local fact"},
		{"iteration limit", 900, 1, subagent.StatusIterationLimit, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 100_000, 50, map[string]int64{"a": tc.limit})
			srv, model := newProviderModel(t, llmtest.OpenAI, false, func(r llmtest.Request) llmtest.Reply {
				if tc.iters == 0 || structured(r) {
					return llmtest.Reply{Text: localFacts}
				}
				return llmtest.Reply{ToolCalls: []llm.ToolCall{{ID: "call_1", Name: "search", Args: json.RawMessage(`{"query":"go"}`)}}}
			})
			task := newTask(b, "a")
			task.MaxIterations = tc.iters

			sum := newLoop(b, model).Run(t.Context(), task)

			if sum.Status != tc.want || len(sum.Facts) == 0 {
				t.Fatalf("status %s (err %v), facts %+v; want %s with the local facts", sum.Status, sum.Err, sum.Facts, tc.want)
			}
			if tc.fact != "" && sum.Facts[0].Text != tc.fact {
				t.Errorf("facts %+v, want the final answer's", sum.Facts)
			}
			if !hasNote(sum, "compress: skipped: reserve") || !hasNote(sum, "budget exhausted") {
				t.Errorf("failed %q, want a note that the budget could not pay for compression", sum.Failed)
			}
			for _, r := range srv.Requests() {
				if structured(r) {
					t.Errorf("request %d asked for the fact summary: compression was not paid for", r.N)
				}
			}
			if res := b.reservations(t); len(res) != 1 {
				t.Errorf("reservations %+v, want the iteration's only", res)
			}
			checkPaid(t, b, srv, sum)
		})
	}
}

// compressFiringLedger fires a watch right after the compression call's
// reservation is granted.
type compressFiringLedger struct {
	*store.Ledger
	watch *chanWatch
}

func (l compressFiringLedger) Reserve(ctx context.Context, p budget.ReserveParams) (budget.Reservation, error) {
	r, err := l.Ledger.Reserve(ctx, p)
	if strings.HasSuffix(p.Key, "/compress") {
		l.watch.fire(budget.RunSignal{RunID: "run1", State: budget.StateExhausted})
	}
	return r, err
}

// TestLoopNoCompressionAfterRunEnded checks that the compression call, like
// every model call, never starts once the worker knows the run ended.
func TestLoopNoCompressionAfterRunEnded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		policy subagent.Policy
		want   subagent.Status
	}{
		// The final call is cancelled; the run ended, so nothing follows it.
		{"exhausted under cancel mid-call", subagent.PolicyCancel, subagent.StatusBudgetExhausted},
		// The final call drains and answers; the run ended, so no compression.
		{"exhausted under drain mid-call", subagent.PolicyDrain, subagent.StatusSucceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
			release := make(chan struct{})
			var releaseOnce sync.Once
			free := func() { releaseOnce.Do(func() { close(release) }) }
			srv, model := newProviderModel(t, llmtest.OpenAI, false, func(r llmtest.Request) llmtest.Reply {
				if tc.policy == subagent.PolicyCancel {
					return llmtest.Reply{Hang: true}
				}
				select {
				case <-release:
					return llmtest.Reply{Text: localFacts}
				case <-time.After(patience):
					return llmtest.Reply{Status: 400, Message: "the test never let the call through"}
				}
			})
			t.Cleanup(free) // before the fake provider closes: it waits for its handlers
			task := newTask(b, "a")
			task.OnExhaustion = tc.policy
			watch := newWatch()
			task.Watch = watch

			wait := goRun(t, t.Context(), newLoop(b, model), task)
			poll(t, "the model call", func() bool { return len(srv.Requests()) == 1 })
			watch.fire(budget.RunSignal{RunID: b.runID, State: budget.StateExhausted})
			free()
			sum := wait("the loop ending after the run was exhausted mid-call")

			if sum.Status != tc.want {
				t.Errorf("status %s (err %v), want %s", sum.Status, sum.Err, tc.want)
			}
			if n := len(srv.Requests()); n != 1 {
				t.Errorf("%d requests, want the iteration's only", n)
			}
			if !hasNote(sum, "compress: skipped") {
				t.Errorf("failed %q, want a note that compression was skipped", sum.Failed)
			}
			if res := b.reservations(t); len(res) != 1 {
				t.Errorf("reservations %+v, want the iteration's only", res)
			}
			b.checkLedger(t)
		})
	}
	t.Run("learned while reserving", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
		srv, model := newProviderModel(t, llmtest.Anthropic, false, agentScript(llmtest.Reply{Text: compressedFacts}))
		task := newTask(b, "a")
		task.OnExhaustion = subagent.PolicyDrain // so only the pre-call check can stop it
		watch := newWatch()
		task.Watch = watch
		loop := newLoop(b, model)
		loop.Ledger = compressFiringLedger{b.ledger, watch}

		sum := loop.Run(t.Context(), task)

		if sum.Status != subagent.StatusSucceeded || len(sum.Facts) != 1 || sum.Facts[0].Text != "local fact" {
			t.Errorf("status %s, facts %+v; want SUCCEEDED with the final answer's fact", sum.Status, sum.Facts)
		}
		for _, r := range srv.Requests() {
			if structured(r) {
				t.Errorf("request %d is a compression call started after the run ended", r.N)
			}
		}
		res := b.reservations(t)
		if len(res) != 3 || res[2].State != "voided" {
			t.Errorf("reservations %+v, want the compression's voided", res)
		}
		if !hasNote(sum, "compress: skipped") {
			t.Errorf("failed %q, want a note that compression was skipped", sum.Failed)
		}
		checkPaid(t, b, srv, sum)
	})
}
