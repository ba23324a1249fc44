package llm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"time"
)

// Learned is one write of what a provider stated of a key's limits for
// one model (store.ProviderLimit, which cmd fills from it): the limits
// learned so far, the newest reading of what is left and when it resets,
// the configured ceilings, and the 429s seen since the last write.
type Learned struct {
	Bucket   string // BucketName of the key: never the key
	Provider string
	Model    string
	// ModelDefault: Model is the provider's default (ProviderConfig.Model).
	ModelDefault bool

	LimitRequests, LimitTokens         int64 // per minute; 0: never stated
	RemainingRequests, RemainingTokens int64 // -1: not stated
	RequestsResetAt, TokensResetAt     time.Time
	ConfiguredRPM, ConfiguredTPM       int64 // ProviderConfig.Limits; 0: none
	Throttled                          int64 // 429s since the last write
	ThrottledUntil                     time.Time
}

// LimitBook keeps what the workers learn of the providers' limits, for
// the fleet (store.ProviderLimits through cmd).
type LimitBook interface {
	Learn(ctx context.Context, l Learned) error
}

// DefaultLearnEvery is ProviderConfig.LearnEvery when unset.
const DefaultLearnEvery = time.Second

// maxModels bounds the models a caller keeps limits for: runs name their
// model, free-form (a tenant can name any), and each kept model is a
// bucket and a metric series. A further model takes the place of a kept
// one that never stated a limit (a name the provider does not serve
// states none) or was not called for modelIdle, the least recently used
// of them; when every kept model states limits and is in use, its calls
// share one bucket (otherModels) under the smallest limit stated for any
// kept model and the configured ceilings, and learn nothing.
const maxModels = 64

// modelIdle is how long a kept model that states limits holds its place
// without a call.
const modelIdle = 10 * time.Minute

// otherModels is the model of the calls past maxModels.
const otherModels = "*"

// modelLimits is what a caller knows of one model's limits. Guarded by
// caller.mu.
type modelLimits struct {
	bucket      string
	metricModel string // the model, or otherModels
	rpm, tpm    int64  // stated; 0: not yet
	defined     bool
	definedAs   RateLimit // the ceilings bucket was last Defined with, before the headroom
	throttled   int64     // 429s not written yet
	until       time.Time // the latest retry-after asked for
	written     time.Time // the last write to the book
	used        time.Time // the last take or reply
}

// stated reports whether a reply stated a limit of the model.
func (m *modelLimits) stated() bool { return m.rpm > 0 || m.tpm > 0 }

// ModelBucket returns the rate-limit bucket of a provider key and model:
// every worker calling model with the key shares it (providers state their
// limits per model). A name too long for a bucket ends in a digest of the
// model instead.
func ModelBucket(provider, key, model string) string {
	b := BucketName(provider, key) + "/" + model
	if len(b) <= 128 {
		return b
	}
	sum := sha256.Sum256([]byte(model))
	return BucketName(provider, key) + "/sha256:" + hex.EncodeToString(sum[:12])
}

// limitsOf returns the limits of model, kept from its first use while
// there is room (see maxModels), else the other models' (c.others), and
// marks them used at now. Hold c.mu.
func (c *caller) limitsOf(model string, now time.Time) *modelLimits {
	m := c.models[model]
	switch {
	case m != nil:
	case len(c.models) < maxModels || c.evict(now):
		m = &modelLimits{bucket: ModelBucket(c.provider, c.cfg.APIKey, model), metricModel: model}
		c.models[model] = m
	default:
		if c.others == nil {
			c.others = &modelLimits{bucket: ModelBucket(c.provider, c.cfg.APIKey, otherModels), metricModel: otherModels}
		}
		m = c.others
	}
	m.used = now
	return m
}

// evict drops the kept model that gives its place first: one that never
// stated a limit, else one not used for modelIdle, the least recently
// used of them. It reports whether it dropped one. The model's bucket
// stays in the Limiter; called again, the model is defined again. Hold
// c.mu.
func (c *caller) evict(now time.Time) bool {
	victim := ""
	var v *modelLimits
	for name, m := range c.models {
		if m.stated() && now.Sub(m.used) < modelIdle {
			continue
		}
		if v == nil || (v.stated() && !m.stated()) || (v.stated() == m.stated() && m.used.Before(v.used)) {
			victim, v = name, m
		}
	}
	if v == nil {
		return false
	}
	delete(c.models, victim)
	return true
}

// smallestStated is the smallest limit stated for any kept model, per
// dimension (0: none stated). Hold c.mu.
func (c *caller) smallestStated() (rpm, tpm int64) {
	for _, m := range c.models {
		if m.rpm > 0 && (rpm == 0 || m.rpm < rpm) {
			rpm = m.rpm
		}
		if m.tpm > 0 && (tpm == 0 || m.tpm < tpm) {
			tpm = m.tpm
		}
	}
	return rpm, tpm
}

// learn takes in what an attempt's reply stated of model's limits. A
// stated limit that changes makes the next take define the bucket again
// (define compares what it would define with what it did).
// The reading is written to the book at once when a limit changed or the
// reply was a 429, and otherwise at most once per LearnEvery per model:
// no write per call.
func (c *caller) learn(ctx context.Context, model string, status int, h http.Header) {
	now := time.Now()
	s := c.parse(h, now)
	throttled := status == http.StatusTooManyRequests
	if !s.Known() && !throttled {
		return
	}
	c.mu.Lock()
	m := c.limitsOf(model, now)
	if m == c.others {
		c.mu.Unlock()
		return
	}
	changed := false
	if s.LimitRequests > 0 && s.LimitRequests != m.rpm {
		m.rpm, changed = s.LimitRequests, true
	}
	if s.LimitTokens > 0 && s.LimitTokens != m.tpm {
		m.tpm, changed = s.LimitTokens, true
	}
	if throttled {
		m.throttled++
		if s.RetryAfter > 0 && now.Add(s.RetryAfter).After(m.until) {
			m.until = now.Add(s.RetryAfter)
		}
	}
	due := c.cfg.Book != nil && (changed || throttled || now.Sub(m.written) >= c.cfg.LearnEvery)
	var rec Learned
	if due {
		rec = Learned{
			Bucket: c.keyBucket, Provider: c.provider, Model: model, ModelDefault: model == c.cfg.Model,
			LimitRequests: m.rpm, LimitTokens: m.tpm,
			RemainingRequests: s.RemainingRequests, RemainingTokens: s.RemainingTokens,
			RequestsResetAt: s.RequestsReset, TokensResetAt: s.TokensReset,
			ConfiguredRPM: c.cfg.Limits.RPM, ConfiguredTPM: c.cfg.Limits.TPM,
			Throttled: m.throttled, ThrottledUntil: m.until,
		}
		m.throttled, m.written = 0, now
	}
	stated := RateLimit{RPM: m.rpm, TPM: m.tpm}
	c.mu.Unlock()
	if changed {
		c.recordStated(ctx, model, stated)
		c.cfg.Logger.InfoContext(ctx, "provider rate limits learned", "provider", c.provider, "model", model,
			"key_id", KeyID(c.cfg.APIKey), "rpm", stated.RPM, "tpm", stated.TPM)
	}
	if !due {
		return
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := c.cfg.Book.Learn(wctx, rec); err != nil {
		c.cfg.Logger.WarnContext(ctx, "record provider rate limits", "provider", c.provider, "model", model, "err", err)
		c.mu.Lock()
		m.throttled += rec.Throttled // counted with the next write
		c.mu.Unlock()
	}
}
