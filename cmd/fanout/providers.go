package main

import (
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/fanout/fanout/node"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// providerFlags choose and configure the models a worker can call. Keys and
// base URLs come from the providers' standard variables, never from flags
// (a flag would show in ps and shell history).
type providerFlags struct {
	provider      string
	openaiModel   string
	openaiStream  bool
	anthropicMdl  string
	rpm, tpm      int64
	modelCalls    int64
	callTimeout   time.Duration
	retryAttempts int
}

func (p *providerFlags) register(f *flags) {
	f.StringVar(&p.provider, "provider", "sim", "the model provider when a run names none: sim, openai or anthropic")
	f.StringVar(&p.openaiModel, "openai-model", "gpt-4o-mini", "OpenAI-compatible model when a run names none")
	f.BoolVar(&p.openaiStream, "openai-stream", true, "stream OpenAI-compatible replies (usage from the final chunk)")
	f.StringVar(&p.anthropicMdl, "anthropic-model", "claude-3-5-haiku-latest", "Anthropic model when a run names none")
	f.Int64Var(&p.rpm, "rpm", 0, "requests per minute allowed per provider key, shared by every worker (0: no limit)")
	f.Int64Var(&p.tpm, "tpm", 0, "tokens per minute allowed per provider key, shared by every worker (0: no limit)")
	f.Int64Var(&p.modelCalls, "max-model-calls", 32, "model calls in flight on this worker, across providers")
	f.DurationVar(&p.callTimeout, "call-timeout", llm.DefaultCallTimeout, "one attempt of one model call")
	f.IntVar(&p.retryAttempts, "retry-attempts", llm.DefaultRetryAttempts, "attempts per call for 408, 429 and 5xx replies")
}

// modelsFunc returns the worker's node.WorkerConfig.ModelsFunc: models
// with the backend's pool (the fleet's rate limiter) and logger.
func (p *providerFlags) modelsFunc(env *Env) func(*node.Backend, llm.Model) (subagent.ModelFunc, error) {
	return func(b *node.Backend, sim llm.Model) (subagent.ModelFunc, error) {
		return p.models(env, b.Pool(), sim, b.Logger())
	}
}

// models builds the worker's ModelFunc: sim always, openai and anthropic
// when their key is set. It names a provider that was asked for by default
// but has no key.
func (p *providerFlags) models(env *Env, pool *store.Pool, sim llm.Model, log *slog.Logger) (subagent.ModelFunc, error) {
	byName := map[string]llm.Model{"sim": sim}
	var limiter llm.Limiter
	if p.rpm > 0 || p.tpm > 0 {
		limiter = store.NewRateLimiter(pool)
	}
	slots := semaphore.NewWeighted(max(p.modelCalls, 1))
	base := func(key, baseURL, model string) llm.ProviderConfig {
		return llm.ProviderConfig{
			APIKey: key, BaseURL: baseURL, Model: model,
			CallTimeout: p.callTimeout,
			Retry:       llm.RetryPolicy{MaxAttempts: p.retryAttempts},
			Limits:      llm.RateLimit{RPM: p.rpm, TPM: p.tpm},
			Limiter:     limiter,
			Slots:       slots,
			Logger:      log,
		}
	}
	if key := env.Getenv("OPENAI_API_KEY"); key != "" {
		m, err := llm.NewOpenAI(llm.OpenAIConfig{ProviderConfig: base(key, env.Getenv("OPENAI_BASE_URL"), p.openaiModel), Stream: p.openaiStream})
		if err != nil {
			return nil, err
		}
		byName["openai"] = m
	}
	if key := env.Getenv("ANTHROPIC_API_KEY"); key != "" {
		m, err := llm.NewAnthropic(llm.AnthropicConfig{ProviderConfig: base(key, env.Getenv("ANTHROPIC_BASE_URL"), p.anthropicMdl)})
		if err != nil {
			return nil, err
		}
		byName["anthropic"] = m
	}
	if _, ok := byName[p.provider]; !ok {
		switch p.provider {
		case "openai":
			return nil, fmt.Errorf("--provider openai: set OPENAI_API_KEY (and OPENAI_BASE_URL for a compatible server)")
		case "anthropic":
			return nil, fmt.Errorf("--provider anthropic: set ANTHROPIC_API_KEY")
		default:
			return nil, fmt.Errorf("--provider %q: not one of sim, openai, anthropic", p.provider)
		}
	}
	return subagent.ProviderModels(byName, p.provider), nil
}
