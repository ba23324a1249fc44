package runs

import "time"

// MaxCacheTTL is the longest a read tool's result may be cached
// (docs/mcp.md#the-result-cache-for-read-tools); the database holds it too.
const MaxCacheTTL = 24 * time.Hour

// MinCacheTTL is the shortest: the cache keeps milliseconds.
const MinCacheTTL = time.Millisecond

// CachedCall names one read tool call in its tenant's result cache
// (docs/mcp.md#the-result-cache-for-read-tools) and the task that asks: the tenant is
// the dispatch's, proved by the task's account and its attempt's secret,
// never what a model sent.
type CachedCall struct {
	// Account, TenantID, RunID and TaskID are the task's (its dispatch).
	Account  int64
	TenantID string
	RunID    string
	TaskID   string
	// Server and Tool are the tool's server ("" for a built-in) and its
	// model-facing name; ArgsHash is the hex SHA-256 of the call's
	// arguments in canonical JSON.
	Server   string
	Tool     string
	ArgsHash string
}
