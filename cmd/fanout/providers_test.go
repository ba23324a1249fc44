package main

import (
	"context"
	"strings"
	"testing"

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
			p := providerFlags{provider: provider, openaiModel: "m", anthropicMdl: "m", modelCalls: 2, retryAttempts: 1}
			sim, err := llm.NewSim(llm.SimConfig{})
			if err != nil {
				t.Fatal(err)
			}
			models, err := p.models(env, nil, sim, nil)
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
	p := providerFlags{provider: "anthropic"}
	_, err := p.models(&Env{Getenv: func(string) string { return "" }}, nil, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "ANTHROPIC_API_KEY") {
		t.Errorf("default anthropic without a key: err = %v, want it to name ANTHROPIC_API_KEY", err)
	}
}
