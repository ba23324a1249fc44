-- 0031: the rate limits the providers state (issue 45;
-- docs/operations.md#rate-limits-and-headroom). Workers read the
-- rate-limit headers of every model response (x-ratelimit-* from
-- OpenAI-compatible servers, anthropic-ratelimit-* from Anthropic, and
-- retry-after on a 429) and keep here the fleet's view of each
-- (provider key, model): the limit per minute, what is left of it and when
-- it resets, the ceiling the worker's flags set, and the 429s seen. The
-- workers' limiter enforces the smaller of the stated limit and the
-- ceiling, times the headroom; the orchestrators read it to size the
-- concurrency of runs that leave theirs unset.
CREATE TABLE fanout.provider_limit (
    bucket text NOT NULL CHECK (bucket <> '' AND octet_length(bucket) <= 128 AND bucket NOT LIKE 'key:%'),
    model text NOT NULL CHECK (octet_length(model) <= 256),
    provider text NOT NULL CHECK (provider <> '' AND octet_length(provider) <= 64),
    provider_default boolean NOT NULL DEFAULT false,
    model_default boolean NOT NULL DEFAULT false,
    limit_requests bigint CHECK (limit_requests > 0),
    limit_tokens bigint CHECK (limit_tokens > 0),
    remaining_requests bigint CHECK (remaining_requests >= 0),
    remaining_tokens bigint CHECK (remaining_tokens >= 0),
    requests_reset_at timestamptz,
    tokens_reset_at timestamptz,
    configured_rpm bigint NOT NULL DEFAULT 0 CHECK (configured_rpm >= 0),
    configured_tpm bigint NOT NULL DEFAULT 0 CHECK (configured_tpm >= 0),
    throttled bigint NOT NULL DEFAULT 0 CHECK (throttled >= 0),
    throttled_until timestamptz,
    learned_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (bucket, model)
);
COMMENT ON TABLE fanout.provider_limit IS
    'The rate limits each provider states for a key and model, as the workers last read them from its responses (docs/operations.md#rate-limits-and-headroom).';
COMMENT ON COLUMN fanout.provider_limit.bucket IS 'The provider key''s rate bucket ("provider:key id"; never the key).';
COMMENT ON COLUMN fanout.provider_limit.model IS 'The model the responses were for, as the worker called it.';
COMMENT ON COLUMN fanout.provider_limit.provider_default IS 'The provider is the workers'' default (a run that names no provider uses it).';
COMMENT ON COLUMN fanout.provider_limit.model_default IS 'The model is the provider''s default on the workers (a run that names no model uses it).';
COMMENT ON COLUMN fanout.provider_limit.limit_requests IS 'Requests per minute the provider states (NULL: not stated).';
COMMENT ON COLUMN fanout.provider_limit.limit_tokens IS 'Tokens per minute the provider states (NULL: not stated).';
COMMENT ON COLUMN fanout.provider_limit.remaining_requests IS 'Requests left in the provider''s window at learned_at.';
COMMENT ON COLUMN fanout.provider_limit.remaining_tokens IS 'Tokens left in the provider''s window at learned_at.';
COMMENT ON COLUMN fanout.provider_limit.configured_rpm IS 'The ceiling the worker''s flags set on requests per minute (0: none).';
COMMENT ON COLUMN fanout.provider_limit.configured_tpm IS 'The ceiling the worker''s flags set on tokens per minute (0: none).';
COMMENT ON COLUMN fanout.provider_limit.throttled IS '429 responses the workers have seen for this key and model, in all.';
COMMENT ON COLUMN fanout.provider_limit.throttled_until IS 'The latest retry-after a 429 asked for.';

-- Workers write what they read (their providers' rows only, as for
-- rate_bucket); orchestrators read it to size runs' concurrency.
GRANT SELECT, INSERT, UPDATE ON TABLE fanout.provider_limit TO fanout_worker;
GRANT SELECT ON TABLE fanout.provider_limit TO fanout_app;
