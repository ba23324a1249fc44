package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ProviderLimit is what a provider stated of its rate limits for one key
// and model (provider_limit; migrations/versioned/0031_provider_limits.sql),
// as the workers last read it from its responses. A figure the provider
// did not state is 0 (a limit, a ceiling) or -1 (what is left of a
// window), a time it did not state the zero time.
type ProviderLimit struct {
	Bucket   string // the key's rate bucket, llm.BucketName: never the key
	Provider string
	Model    string
	// ProviderDefault: the workers use this provider for a run that names
	// none; ModelDefault: this model for a run that names the provider
	// but no model.
	ProviderDefault, ModelDefault bool

	LimitRequests, LimitTokens         int64 // per minute, as stated
	RemainingRequests, RemainingTokens int64 // left in the provider's window at LearnedAt; -1: not stated
	RequestsResetAt, TokensResetAt     time.Time
	// ConfiguredRPM and ConfiguredTPM are the ceilings the worker's flags
	// set (0: none).
	ConfiguredRPM, ConfiguredTPM int64
	// Throttled counts the 429s seen for this key and model. To Learn it
	// is how many more were seen since the last call.
	Throttled      int64
	ThrottledUntil time.Time // the latest retry-after asked for
	LearnedAt      time.Time // set by the database
}

// RPM returns the requests per minute the fleet may send: the stated
// limit under the configured ceiling, whichever of them is known; 0 when
// neither is. TPM is the same for tokens. Neither applies a headroom.
func (l ProviderLimit) RPM() int64 { return ceiling(l.LimitRequests, l.ConfiguredRPM) }

// TPM is RPM for tokens per minute.
func (l ProviderLimit) TPM() int64 { return ceiling(l.LimitTokens, l.ConfiguredTPM) }

func ceiling(stated, configured int64) int64 {
	switch {
	case stated <= 0:
		return configured
	case configured <= 0:
		return stated
	}
	return min(stated, configured)
}

// ProviderLimitsFresh is how long a row of provider_limit counts after it
// was last learned: a worker calling a key and model writes its row at
// least once a second, so an older row is a key rotated out, a model no
// longer called or a worker gone. Limits reads only fresher rows.
const ProviderLimitsFresh = 15 * time.Minute

// ProviderLimits keeps the fleet's view of the providers' stated rate
// limits: workers Learn from every response, orchestrators read Limits to
// size the concurrency of runs that leave it unset
// (docs/operations.md#rate-limits-and-headroom).
type ProviderLimits struct {
	db
}

// NewProviderLimits returns the provider limits on pool (a worker's ledger
// pool, an orchestrator's).
func NewProviderLimits(pool *Pool, config ...RateLimiterConfig) *ProviderLimits {
	return &ProviderLimits{db: newDB(pool, configOf(config).Logger)}
}

// learnSQL records one reading: a stated figure replaces the one before,
// an unstated one (NULL) keeps it; throttled adds up; throttled_until only
// moves forward. A reading of the default model takes model_default from
// the provider's other models, one of the default provider takes
// provider_default from the other providers: after a worker's
// --openai-model or --provider changed, a run naming neither is sized by
// the new default only. When workers disagree (a rolling change of the
// flag), the last to write is the default until the next write: a run
// naming neither is served by either. The rows a reading clears are only
// those still flagged, so a fleet that agrees writes one row a reading.
const learnSQL = `
WITH cleared AS (
	UPDATE provider_limit SET
		model_default = model_default AND NOT ($5 AND provider = $3),
		provider_default = provider_default AND NOT ($4 AND provider <> $3)
	WHERE NOT (bucket = $1 AND model = $2)
	  AND (($5 AND model_default AND provider = $3 AND model <> $2)
	    OR ($4 AND provider_default AND provider <> $3))
)
INSERT INTO provider_limit AS p (bucket, model, provider, provider_default, model_default,
	limit_requests, limit_tokens, remaining_requests, remaining_tokens, requests_reset_at, tokens_reset_at,
	configured_rpm, configured_tpm, throttled, throttled_until)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
ON CONFLICT (bucket, model) DO UPDATE SET
	provider = EXCLUDED.provider,
	provider_default = EXCLUDED.provider_default,
	model_default = EXCLUDED.model_default,
	limit_requests = coalesce(EXCLUDED.limit_requests, p.limit_requests),
	limit_tokens = coalesce(EXCLUDED.limit_tokens, p.limit_tokens),
	remaining_requests = coalesce(EXCLUDED.remaining_requests, p.remaining_requests),
	remaining_tokens = coalesce(EXCLUDED.remaining_tokens, p.remaining_tokens),
	requests_reset_at = coalesce(EXCLUDED.requests_reset_at, p.requests_reset_at),
	tokens_reset_at = coalesce(EXCLUDED.tokens_reset_at, p.tokens_reset_at),
	configured_rpm = EXCLUDED.configured_rpm,
	configured_tpm = EXCLUDED.configured_tpm,
	throttled = p.throttled + EXCLUDED.throttled,
	throttled_until = greatest(p.throttled_until, EXCLUDED.throttled_until),
	learned_at = now()`

// Learn records what a provider stated in a response (l.Throttled: how
// many 429s more). Figures it did not state keep their last value.
func (p *ProviderLimits) Learn(ctx context.Context, l ProviderLimit) error {
	if l.Throttled < 0 {
		return fmt.Errorf("learn rate limits of %s %s: throttled %d: must be >= 0", l.Bucket, l.Model, l.Throttled)
	}
	// Not idempotent (throttled adds up), but a retried reading that had
	// committed only counts a 429 twice: the orchestrators then lower a
	// concurrency once more, never raise one.
	err := retried(ctx, p.log, "providerlimits.learn", idempotent, func(ctx context.Context, _ try) error {
		_, err := p.pool.Exec(ctx, learnSQL, l.Bucket, l.Model, l.Provider, l.ProviderDefault, l.ModelDefault,
			positive(l.LimitRequests), positive(l.LimitTokens), known(l.RemainingRequests), known(l.RemainingTokens),
			when(l.RequestsResetAt), when(l.TokensResetAt), l.ConfiguredRPM, l.ConfiguredTPM, l.Throttled,
			when(l.ThrottledUntil))
		return err
	})
	if err != nil {
		return fmt.Errorf("learn rate limits of %s %s: %w", l.Bucket, l.Model, err)
	}
	return nil
}

// Limits returns what is known of the limits a run naming provider and
// model calls under, one row per provider key learned within
// ProviderLimitsFresh: "" for either means the workers' default, as the
// run would be served. None is known: no rows.
func (p *ProviderLimits) Limits(ctx context.Context, provider, model string) ([]ProviderLimit, error) {
	var out []ProviderLimit
	err := retried(ctx, p.log, "providerlimits.limits", idempotent, func(ctx context.Context, _ try) error {
		rows, err := p.pool.Query(ctx, `
			SELECT bucket, provider, model, provider_default, model_default,
				coalesce(limit_requests, 0), coalesce(limit_tokens, 0),
				coalesce(remaining_requests, -1), coalesce(remaining_tokens, -1),
				requests_reset_at, tokens_reset_at,
				configured_rpm, configured_tpm, throttled, throttled_until, learned_at
			FROM provider_limit
			WHERE (provider = $1 OR ($1 = '' AND provider_default))
			  AND (model = $2 OR ($2 = '' AND model_default))
			  AND learned_at > now() - make_interval(secs => $3)
			ORDER BY bucket, model`, provider, model, ProviderLimitsFresh.Seconds())
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ProviderLimit, error) {
			var l ProviderLimit
			var reqReset, tokReset, until *time.Time
			err := r.Scan(&l.Bucket, &l.Provider, &l.Model, &l.ProviderDefault, &l.ModelDefault,
				&l.LimitRequests, &l.LimitTokens, &l.RemainingRequests, &l.RemainingTokens,
				&reqReset, &tokReset, &l.ConfiguredRPM, &l.ConfiguredTPM,
				&l.Throttled, &until, &l.LearnedAt)
			for _, t := range []struct{ from, to *time.Time }{{reqReset, &l.RequestsResetAt}, {tokReset, &l.TokensResetAt}, {until, &l.ThrottledUntil}} {
				if t.from != nil {
					*t.to = *t.from
				}
			}
			return l, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read rate limits of provider %q model %q: %w", provider, model, err)
	}
	return out, nil
}

// positive is n for the database, NULL when it is not > 0.
func positive(n int64) *int64 {
	if n <= 0 {
		return nil
	}
	return &n
}

// known is n for the database, NULL when it is < 0.
func known(n int64) *int64 {
	if n < 0 {
		return nil
	}
	return &n
}

// when is t for the database, NULL when it is the zero time.
func when(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
