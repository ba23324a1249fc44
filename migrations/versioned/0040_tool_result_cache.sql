-- 0040: the result cache of read tools (issue 46; docs/mcp.md#the-result-cache-for-read-tools).
-- A read tool whose policy gives it a cache_ttl (docs/mcp.md) may be
-- answered, in a run that opted in (RunSpec.cache.tools), from an earlier
-- call of the same tool with the same arguments by the same tenant, for as
-- long as the TTL says. Keyed by tenant: one tenant's entry never answers
-- another's call. Workers read and write it only through tool_cache_get and
-- tool_cache_put, which ask for the attempt's secret of a task of that
-- tenant (ledger_secret_ok), so a worker's login reads no tenant's results
-- but those of the tasks dispatched to it. Bounded: an entry is at most 16
-- MiB of result and lives at most 24 hours; expired entries are deleted by
-- the get that finds one and by every put (up to 100 of its tenant's), and
-- a tenant keeps at most 10,000 entries (a put past that evicts the oldest).
CREATE TABLE fanout.tool_result_cache (
    tenant_id  text NOT NULL CHECK (tenant_id <> '' AND octet_length(tenant_id) <= 128),
    server     text NOT NULL CHECK (octet_length(server) <= 256),
    tool       text NOT NULL CHECK (tool <> '' AND octet_length(tool) <= 256),
    args_hash  text NOT NULL CHECK (args_hash ~ '^[0-9a-f]{64}$'),
    result     jsonb NOT NULL CHECK (octet_length(result::text) <= 17825792),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL CHECK (expires_at > created_at AND expires_at <= created_at + interval '24 hours'),
    PRIMARY KEY (tenant_id, server, tool, args_hash)
);
-- The oldest entries of a tenant (eviction past the bound) and its expired
-- ones (deleted by a put).
CREATE INDEX tool_result_cache_age ON fanout.tool_result_cache (tenant_id, created_at);
CREATE INDEX tool_result_cache_expiry ON fanout.tool_result_cache (tenant_id, expires_at);
COMMENT ON TABLE fanout.tool_result_cache IS
    'Results of read tool calls a tenant''s runs may reuse until expires_at (database time): never another tenant''s, never a write''s (docs/mcp.md#the-result-cache-for-read-tools).';
COMMENT ON COLUMN fanout.tool_result_cache.server IS 'The MCP server the tool is on ('''' for a built-in tool).';
COMMENT ON COLUMN fanout.tool_result_cache.tool IS 'The tool''s model-facing name (server__tool), as tool_call.tool.';
COMMENT ON COLUMN fanout.tool_result_cache.args_hash IS
    'Hex SHA-256 of the call''s arguments in canonical JSON (keys sorted, no insignificant whitespace, numbers as written).';
COMMENT ON COLUMN fanout.tool_result_cache.result IS 'What the call returned to the model: {"text": ..., "sources": [...]}.';
COMMENT ON COLUMN fanout.tool_result_cache.expires_at IS 'created_at plus the tool''s cache_ttl (at most 24 hours); a get at or past it is a miss.';
