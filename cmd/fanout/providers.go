package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
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
	openaiLimit   llm.RateLimit
	anthropicLim  llm.RateLimit
	headroom      float64
	rpm, tpm      int64 // deprecated: both providers' limits
	modelCalls    int64
	callTimeout   time.Duration
	retryAttempts int
	// limiter, if set, replaces the fleet's store.RateLimiter (tests).
	limiter llm.Limiter
}

func (p *providerFlags) register(f *flags) {
	f.StringVar(&p.provider, "provider", "sim", "the model provider when a run names none: sim, openai or anthropic")
	f.StringVar(&p.openaiModel, "openai-model", "gpt-4o-mini", "OpenAI-compatible model when a run names none")
	f.BoolVar(&p.openaiStream, "openai-stream", true, "stream OpenAI-compatible replies (usage from the final chunk)")
	f.StringVar(&p.anthropicMdl, "anthropic-model", "claude-3-5-haiku-latest", "Anthropic model when a run names none")
	f.Int64Var(&p.openaiLimit.RPM, "openai-rpm", 0, "ceiling of the OpenAI key's requests per minute for each model, shared by every worker, over the limit the provider states (0: the stated limit alone)")
	f.Int64Var(&p.openaiLimit.TPM, "openai-tpm", 0, "ceiling of the OpenAI key's tokens per minute for each model, shared by every worker, over the limit the provider states (0: the stated limit alone)")
	f.Int64Var(&p.anthropicLim.RPM, "anthropic-rpm", 0, "ceiling of the Anthropic key's requests per minute for each model, shared by every worker, over the limit the provider states (0: the stated limit alone)")
	f.Int64Var(&p.anthropicLim.TPM, "anthropic-tpm", 0, "ceiling of the Anthropic key's tokens per minute for each model, shared by every worker, over the limit the provider states (0: the stated limit alone)")
	f.Float64Var(&p.headroom, "rate-headroom", llm.DefaultHeadroom, "the fraction of each provider limit (the smaller of stated and ceiling) the fleet uses, in (0, 1]")
	f.Int64Var(&p.rpm, "rpm", 0, "deprecated: --openai-rpm and --anthropic-rpm both (each wins where set)")
	f.Int64Var(&p.tpm, "tpm", 0, "deprecated: --openai-tpm and --anthropic-tpm both (each wins where set)")
	f.Int64Var(&p.modelCalls, "max-model-calls", 32, "model calls in flight on this worker, across providers")
	f.DurationVar(&p.callTimeout, "call-timeout", llm.DefaultCallTimeout, "one attempt of one model call")
	f.IntVar(&p.retryAttempts, "retry-attempts", llm.DefaultRetryAttempts, "attempts per call for 408, 429 and 5xx replies")
}

// modelsFunc returns the worker's node.WorkerConfig.ModelsFunc: models
// with the backend's rate limiter and provider limits (the fleet's, on its
// ledger pool) and logger.
func (p *providerFlags) modelsFunc(env *Env) func(*node.Backend, llm.Model) (subagent.ModelFunc, error) {
	return func(b *node.Backend, sim llm.Model) (subagent.ModelFunc, error) {
		return p.models(env, b.Stores().RateLimiter, b.Stores().ProviderLimits, sim, b.Logger())
	}
}

// limitBook records what the providers state in provider_limit, marking
// the worker's default provider (a run that names none is served by it).
type limitBook struct {
	limits          *store.ProviderLimits
	defaultProvider string
}

func (b limitBook) Learn(ctx context.Context, l llm.Learned) error {
	return b.limits.Learn(ctx, store.ProviderLimit{
		Bucket: l.Bucket, Provider: l.Provider, Model: l.Model,
		ProviderDefault: l.Provider == b.defaultProvider, ModelDefault: l.ModelDefault,
		LimitRequests: l.LimitRequests, LimitTokens: l.LimitTokens,
		RemainingRequests: l.RemainingRequests, RemainingTokens: l.RemainingTokens,
		RequestsResetAt: l.RequestsResetAt, TokensResetAt: l.TokensResetAt,
		ConfiguredRPM: l.ConfiguredRPM, ConfiguredTPM: l.ConfiguredTPM,
		Throttled: l.Throttled, ThrottledUntil: l.ThrottledUntil,
	})
}

// limits returns each provider's stated limits with the headroom, the
// deprecated --rpm/--tpm filling a provider's that is unset. Its errors
// name the flag and the bound it breaks.
func (p *providerFlags) limits() (openai, anthropic llm.RateLimit, err error) {
	if !(p.headroom > 0 && p.headroom <= 1) {
		return openai, anthropic, fmt.Errorf("--rate-headroom %v: must be in (0, 1], the fraction of each provider's stated RPM/TPM to use", p.headroom)
	}
	build := func(name string, l llm.RateLimit) (llm.RateLimit, error) {
		rpmFlag, tpmFlag := "--"+name+"-rpm", "--"+name+"-tpm"
		if l.RPM == 0 && p.rpm != 0 {
			l.RPM, rpmFlag = p.rpm, "--rpm"
		}
		if l.TPM == 0 && p.tpm != 0 {
			l.TPM, tpmFlag = p.tpm, "--tpm"
		}
		l.Headroom = p.headroom
		for _, d := range []struct {
			flag string
			v    int64
		}{{rpmFlag, l.RPM}, {tpmFlag, l.TPM}} {
			if d.v < 0 {
				return l, fmt.Errorf("%s %d: must be >= 0 (0: no limit)", d.flag, d.v)
			}
			if _, err := (llm.RateLimit{RPM: d.v, Headroom: p.headroom}).Effective(); err != nil {
				return l, fmt.Errorf("%s %d with --rate-headroom %v allows 0 per minute: the limit must be at least %d",
					d.flag, d.v, p.headroom, int64(math.Ceil(1/p.headroom)))
			}
		}
		return l, nil
	}
	if openai, err = build("openai", p.openaiLimit); err != nil {
		return openai, anthropic, err
	}
	anthropic, err = build("anthropic", p.anthropicLim)
	return openai, anthropic, err
}

// models builds the worker's ModelFunc: sim always, openai and anthropic
// when their key is set. It names a provider that was asked for by default
// but has no key, and a limit flag out of its bounds. The providers wait
// for fleet, the fleet's rate limiter (unless p.limiter replaces it), for
// the limits their replies state under the flags' ceilings, and record
// what the replies state in book; nil fleet or book: none.
func (p *providerFlags) models(env *Env, fleet *store.RateLimiter, book *store.ProviderLimits, sim llm.Model, log *slog.Logger) (subagent.ModelFunc, error) {
	byName := map[string]llm.Model{"sim": sim}
	openaiLimit, anthropicLimit, err := p.limits()
	if err != nil {
		return nil, err
	}
	if (p.rpm > 0 || p.tpm > 0) && log != nil {
		log.Warn("--rpm and --tpm are deprecated: use --openai-rpm, --openai-tpm, --anthropic-rpm, --anthropic-tpm",
			"rpm", p.rpm, "tpm", p.tpm)
	}
	// The fleet's limiter even without a ceiling: the limits the
	// providers state are enforced once a reply states them (nothing is
	// taken from it before).
	limiter := p.limiter
	if limiter == nil && fleet != nil {
		limiter = fleet
	}
	var limits llm.LimitBook
	if book != nil {
		limits = limitBook{limits: book, defaultProvider: p.provider}
	}
	slots := semaphore.NewWeighted(max(p.modelCalls, 1))
	base := func(key, baseURL, model string, ceilings llm.RateLimit) llm.ProviderConfig {
		return llm.ProviderConfig{
			APIKey: key, BaseURL: baseURL, Model: model,
			CallTimeout: p.callTimeout,
			Retry:       llm.RetryPolicy{MaxAttempts: p.retryAttempts},
			Limits:      ceilings,
			Limiter:     limiter,
			Book:        limits,
			Slots:       slots,
			Logger:      log,
		}
	}
	openaiKey, err := secretEnv(env, "OPENAI_API_KEY")
	if err != nil {
		return nil, err
	}
	anthropicKey, err := secretEnv(env, "ANTHROPIC_API_KEY")
	if err != nil {
		return nil, err
	}
	if openaiKey != "" {
		m, err := llm.NewOpenAI(llm.OpenAIConfig{ProviderConfig: base(openaiKey, env.Getenv("OPENAI_BASE_URL"), p.openaiModel, openaiLimit), Stream: p.openaiStream})
		if err != nil {
			return nil, err
		}
		byName["openai"] = m
	}
	if anthropicKey != "" {
		m, err := llm.NewAnthropic(llm.AnthropicConfig{ProviderConfig: base(anthropicKey, env.Getenv("ANTHROPIC_BASE_URL"), p.anthropicMdl, anthropicLimit)})
		if err != nil {
			return nil, err
		}
		byName["anthropic"] = m
	}
	if _, ok := byName[p.provider]; !ok {
		switch p.provider {
		case "openai":
			return nil, fmt.Errorf("--provider openai: set OPENAI_API_KEY or OPENAI_API_KEY_FILE (and OPENAI_BASE_URL for a compatible server)")
		case "anthropic":
			return nil, fmt.Errorf("--provider anthropic: set ANTHROPIC_API_KEY or ANTHROPIC_API_KEY_FILE")
		default:
			return nil, fmt.Errorf("--provider %q: not one of sim, openai, anthropic", p.provider)
		}
	}
	return subagent.ProviderModels(byName, p.provider), nil
}

// secretEnv is the secret in environment variable name, or read from the
// file named by name_FILE (a mounted Secret: nothing secret in the
// environment), or "" when neither is set. Both set is an error; so is a
// file that is empty or cannot be read. No error says what the secret is.
func secretEnv(env *Env, name string) (string, error) {
	v, file := env.Getenv(name), env.Getenv(name+"_FILE")
	switch {
	case file == "":
		return v, nil
	case v != "":
		return "", fmt.Errorf("%s and %s_FILE are both set: give one", name, name)
	}
	v, err := readSecretFile(file)
	if err != nil {
		return "", fmt.Errorf("%s_FILE: %w", name, err)
	}
	return v, nil
}
