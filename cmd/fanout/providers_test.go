package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/llm"
	"github.com/fanout/fanout/subagent/llm/llmtest"
)

// TestProvidersFromEnvironment: the worker's providers come from the
// standard variables, reach the configured base URL with the key in the
// provider's auth header, and a default provider without a key is refused
// with the variable to set.
func TestProvidersFromEnvironment(t *testing.T) {
	const key = "sk-canary-0123456789abcdef"
	for _, provider := range []string{llmtest.OpenAI, llmtest.Anthropic} {
		t.Run(provider, func(t *testing.T) {
			srv := llmtest.New(llmtest.Config{Provider: provider, Key: key})
			defer srv.Close()
			prefix := strings.ToUpper(provider)
			vars := map[string]string{prefix + "_API_KEY": key, prefix + "_BASE_URL": srv.BaseURL()}
			env := &Env{Getenv: func(k string) string { return vars[k] }}
			p := providerFlags{provider: provider, openaiModel: "m", anthropicMdl: "m", modelCalls: 2, retryAttempts: 1, headroom: llm.DefaultHeadroom}
			sim, err := llm.NewSim(llm.SimConfig{})
			if err != nil {
				t.Fatal(err)
			}
			models, err := p.models(env, nil, nil, sim, nil)
			if err != nil {
				t.Fatal(err)
			}
			m, err := models(&fanoutv1.ModelSettings{}) // the worker's default provider
			if err != nil {
				t.Fatal(err)
			}
			resp, err := m.Call(context.Background(), llm.Request{
				Messages:  []llm.Message{{Role: llm.RoleUser, Content: "hello"}},
				MaxTokens: 50,
				Meta:      llm.Meta{RunID: "r", TaskID: "t", Iteration: 1},
			})
			if err != nil {
				t.Fatalf("call: %v", err)
			}
			if resp.Usage.InputTokens == 0 || resp.Content == "" {
				t.Errorf("response = %+v", resp)
			}
			reqs := srv.Requests()
			if len(reqs) != 1 || !reqs[0].AuthOK {
				t.Errorf("server saw %+v; want one request with the key in the auth header", reqs)
			}
			if m, err := models(&fanoutv1.ModelSettings{Provider: "sim"}); err != nil || m != llm.Model(sim) {
				t.Errorf("provider sim = %v, %v", m, err)
			}
		})
	}
	p := providerFlags{provider: "anthropic", headroom: llm.DefaultHeadroom}
	_, err := p.models(&Env{Getenv: func(string) string { return "" }}, nil, nil, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "ANTHROPIC_API_KEY") {
		t.Errorf("default anthropic without a key: err = %v, want it to name ANTHROPIC_API_KEY", err)
	}
}

// parseProviderFlags registers the provider flags on a worker's flag set
// and parses args and env, as the worker command does.
func parseProviderFlags(t *testing.T, args []string, env map[string]string) *providerFlags {
	t.Helper()
	var p providerFlags
	f := newFlags("worker", "", io.Discard)
	p.register(f)
	if err := f.parse(args, func(k string) string { return env[k] }); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	return &p
}

// TestProviderLimitFlagsPerProvider: each provider's RPM is its own, so a
// slow openai key does not hold anthropic back nor the other way round;
// the deprecated --rpm sets both, and a provider's own flag wins over it.
func TestProviderLimitFlagsPerProvider(t *testing.T) {
	t.Parallel()
	const key = "sk-canary-0123456789abcdef"
	for _, tc := range []struct {
		name string
		args []string
		slow map[string]bool // 10 RPM: the first call from an empty bucket waits 8.6s
	}{
		{"openai-slow", []string{"--openai-rpm", "10", "--anthropic-rpm", "60000"}, map[string]bool{llmtest.OpenAI: true}},
		{"anthropic-slow", []string{"--openai-rpm", "60000", "--anthropic-rpm", "10"}, map[string]bool{llmtest.Anthropic: true}},
		{"deprecated-both", []string{"--rpm", "10"}, map[string]bool{llmtest.OpenAI: true, llmtest.Anthropic: true}},
		{"deprecated-overridden", []string{"--rpm", "10", "--anthropic-rpm", "60000"}, map[string]bool{llmtest.OpenAI: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{}
			for _, provider := range []string{llmtest.OpenAI, llmtest.Anthropic} {
				srv := llmtest.New(llmtest.Config{Provider: provider, Key: key})
				t.Cleanup(srv.Close)
				prefix := strings.ToUpper(provider)
				env[prefix+"_API_KEY"], env[prefix+"_BASE_URL"] = key, srv.BaseURL()
			}
			p := parseProviderFlags(t, tc.args, nil)
			p.limiter = llm.NewMemoryLimiter()
			sim, err := llm.NewSim(llm.SimConfig{})
			if err != nil {
				t.Fatal(err)
			}
			models, err := p.models(&Env{Getenv: func(k string) string { return env[k] }}, nil, nil, sim, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, provider := range []string{llmtest.OpenAI, llmtest.Anthropic} {
				m, err := models(&fanoutv1.ModelSettings{Provider: provider})
				if err != nil {
					t.Fatal(err)
				}
				wait := 2 * time.Second
				if tc.slow[provider] {
					wait = 200 * time.Millisecond
				}
				ctx, cancel := context.WithTimeout(t.Context(), wait)
				defer cancel()
				for i := range 3 {
					_, err := m.Call(ctx, llm.Request{
						Messages:  []llm.Message{{Role: llm.RoleUser, Content: "hello"}},
						MaxTokens: 50,
						Meta:      llm.Meta{RunID: "r", TaskID: "t", Iteration: 1},
					})
					switch {
					case tc.slow[provider] && err == nil:
						t.Errorf("%s, at 10 RPM, started call %d at once", provider, i+1)
					case !tc.slow[provider] && err != nil:
						t.Errorf("%s, at 60000 RPM, call %d: %v", provider, i+1, err)
					}
					if err != nil {
						break
					}
				}
			}
		})
	}
}

// TestProviderLimitFlagsValidated: a headroom outside (0, 1], a negative
// limit and a limit the headroom rounds to 0 (which would mean no limit)
// are refused, naming the flag and the bound.
func TestProviderLimitFlagsValidated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want []string
	}{
		{args: []string{"--rate-headroom", "0"}, want: []string{"--rate-headroom 0", "(0, 1]"}},
		{args: []string{"--rate-headroom", "1.5"}, want: []string{"--rate-headroom 1.5", "(0, 1]"}},
		{args: []string{"--rate-headroom", "-0.2"}, want: []string{"--rate-headroom -0.2", "(0, 1]"}},
		{env: map[string]string{"FANOUT_RATE_HEADROOM": "2"}, want: []string{"--rate-headroom 2", "(0, 1]"}},
		{args: []string{"--rate-headroom", "NaN"}, want: []string{"--rate-headroom NaN", "(0, 1]"}},
		{args: []string{"--openai-rpm", "-1"}, want: []string{"--openai-rpm -1", ">= 0"}},
		{args: []string{"--anthropic-tpm", "-5"}, want: []string{"--anthropic-tpm -5", ">= 0"}},
		{args: []string{"--tpm", "-5"}, want: []string{"--tpm -5", ">= 0"}},
		{args: []string{"--anthropic-rpm", "1"}, want: []string{"--anthropic-rpm 1", "--rate-headroom 0.7", "at least 2"}},
		{args: []string{"--rpm", "1"}, want: []string{"--rpm 1", "at least 2"}},
		{args: []string{"--openai-tpm", "3", "--rate-headroom", "0.3"}, want: []string{"--openai-tpm 3", "--rate-headroom 0.3", "at least 4"}},
		{args: []string{"--openai-rpm", "1", "--rate-headroom", "1"}},
		{args: []string{"--openai-rpm", "2", "--anthropic-tpm", "100000"}},
	} {
		p := parseProviderFlags(t, tc.args, tc.env)
		p.limiter = llm.NewMemoryLimiter()
		_, err := p.models(&Env{Getenv: func(string) string { return "" }}, nil, nil, nil, nil)
		if len(tc.want) == 0 {
			if err != nil {
				t.Errorf("%q: %v, want accepted", tc.args, err)
			}
			continue
		}
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%q %v: err = %v, want it to name %q", tc.args, tc.env, err, w)
			}
		}
	}
}
