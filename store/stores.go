package store

import (
	"context"
	"errors"
	"log/slog"
)

// StoresConfig configures OpenStores. Zero values take the documented
// defaults.
type StoresConfig struct {
	// DatabaseURL is the login of the process's nodes (a member of
	// fanout_app or fanout_worker). Required.
	DatabaseURL string
	// LedgerPool and APIPool are the sizes of the two pools (PoolConfig's
	// MaxConns: they win over the URL's pool_max_conns). Zero: the URL's,
	// or 16 if it sets none.
	LedgerPool, APIPool int32
	// GroupCommit coalesces the ledger's and the run store's calls that
	// arrive together into one transaction (LedgerConfig.Coalesce,
	// RunsConfig.Coalesce). Stores with it must be closed with Close.
	GroupCommit bool
	// Logger receives every store's warnings (retried database errors, a
	// lost LISTEN connection). Default slog.Default().
	Logger *slog.Logger
	// WorkersOnly: the process serves no orchestrator, so its Notifier
	// does not listen on RunEventsChannel (NotifierConfig.WithoutRunEvents).
	WorkersOnly bool
}

// Stores is every store a node process uses, each built once by
// OpenStores on the pool it belongs to. The process has two pools, and
// which one a store is on follows from who waits for it:
//
//   - the ledger pool ("fanout-ledger") carries what a paid model call
//     waits on, or what keeps the ledger exact behind it: reserve, settle,
//     lease renewal, the exhaustion watcher's polls, the sweeper, the
//     worker's tool writes (recorded before each is sent), the fleet's
//     semaphore slots and the providers' rate limits. An API caller waits
//     on it only for one ledger row read or written through the engine's
//     ledger (GetRun's budget, CancelRun, StartRun's tenant account), so a
//     flood of callers queues on the API pool, not in front of a
//     reservation or a lease renewal.
//   - the API pool ("fanout-api") carries what an API caller (or the
//     engine driving a run) waits on: the run store (runs, tasks, events,
//     and the reads of GetRun, ListRuns and WatchRun), approvals, spend,
//     and the API keys an authenticator looks up.
//
// A store on the "wrong" pool by its tables is so on purpose: Runs.OpenRun
// opens the run's ledger accounts (ledger_open_run) in the transaction
// that creates the run, so it runs where the run store does, on the API
// pool: a StartRun caller waits for it, and it must not take a connection
// a reservation needs. ToolCalls is built twice, on both pools, for the
// same reason: a worker's writes are part of a paid call (the ledger
// pool), a person's decision on one is an API write (the API pool).
//
// The notifier is the process's one LISTEN connection, outside both pools
// ("fanout-listen"); Run it (the caller owns its goroutine).
type Stores struct {
	// On the ledger pool.

	// Ledger is the budget ledger (budget.Ledger), with group commit when
	// StoresConfig.GroupCommit is set.
	Ledger *Ledger
	// Writes is the log of a worker's tool writes (subagent.WriteLog).
	Writes *ToolCalls
	// ToolCache is the tenants' result cache of read tools
	// (subagent.ToolCache), which a worker asks before such a call.
	ToolCache *ToolCache
	// Semaphore holds the fleet's slots: a tenant's task slots on an
	// orchestrator, MCP servers' max_in_flight on a worker.
	Semaphore *Semaphore
	// RateLimiter holds the providers' and MCP tools' rate limits, which
	// every call made on a worker waits for.
	RateLimiter *RateLimiter
	// ProviderLimits is the fleet's view of the limits the model providers
	// state: a worker's providers Learn it, an orchestrator reads it.
	ProviderLimits *ProviderLimits
	// Watch is the exhaustion watcher's source: notices from Notifier, and
	// the poll of the run accounts.
	Watch *WatchSource

	// On the API pool.

	// Runs is the run store (orchestrator.RunStore), with group commit when
	// StoresConfig.GroupCommit is set.
	Runs *Runs
	// Approvals lists and decides the writes that wait for approval.
	Approvals *ToolCalls
	// Spending reads a tenant's spend in money (GetSpend).
	Spending *Spending
	// Keys are the tenants and API keys an authenticator looks up, hearing
	// key events from Notifier; its key-rate buckets are on this pool too.
	Keys *Keys

	// Notifier is the process's one LISTEN connection.
	Notifier *Notifier

	ledgerPool, apiPool *Pool
}

// OpenStores opens the ledger and API pools on cfg.DatabaseURL (checking
// that each answers) and builds every store once on its pool. Close
// closes them.
func OpenStores(ctx context.Context, cfg StoresConfig) (*Stores, error) {
	if cfg.DatabaseURL == "" {
		return nil, errors.New("open stores: a database URL is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ledgerPool, err := OpenPool(ctx, cfg.DatabaseURL, PoolConfig{MaxConns: cfg.LedgerPool, Name: "fanout-ledger"})
	if err != nil {
		return nil, err
	}
	apiPool, err := OpenPool(ctx, cfg.DatabaseURL, PoolConfig{MaxConns: cfg.APIPool, Name: "fanout-api"})
	if err != nil {
		ledgerPool.Close()
		return nil, err
	}
	log := cfg.Logger
	n := NewNotifier(cfg.DatabaseURL, NotifierConfig{Logger: log, WithoutRunEvents: cfg.WorkersOnly})
	return &Stores{
		Ledger:         NewLedger(ledgerPool, LedgerConfig{Coalesce: cfg.GroupCommit, Logger: log}),
		Writes:         NewToolCalls(ledgerPool, ToolCallsConfig{Logger: log}),
		ToolCache:      NewToolCache(ledgerPool, log),
		Semaphore:      NewSemaphore(ledgerPool, SemaphoreConfig{Logger: log}),
		RateLimiter:    NewRateLimiter(ledgerPool, RateLimiterConfig{Logger: log}),
		ProviderLimits: NewProviderLimits(ledgerPool, RateLimiterConfig{Logger: log}),
		Watch:          NewWatchSource(ledgerPool, n),

		Runs:      NewRuns(apiPool, RunsConfig{Coalesce: cfg.GroupCommit, Logger: log}),
		Approvals: NewToolCalls(apiPool, ToolCallsConfig{Logger: log}),
		Spending:  NewSpending(apiPool, SpendingConfig{Logger: log}),
		Keys:      NewKeys(apiPool, n),

		Notifier:   n,
		ledgerPool: ledgerPool,
		apiPool:    apiPool,
	}, nil
}

// LedgerPool is the ledger's pool (the process's health checks use it
// too: a background query no caller waits for).
func (s *Stores) LedgerPool() *Pool { return s.ledgerPool }

// APIPool is the run store's and the API's pool.
func (s *Stores) APIPool() *Pool { return s.apiPool }

// Close flushes the ledger's and the run store's pending batches and
// closes both pools. Stop what uses the stores (and the Notifier's Run)
// first.
func (s *Stores) Close() {
	s.Ledger.Close()
	s.Runs.Close()
	s.apiPool.Close()
	s.ledgerPool.Close()
}

// AdminStores are the stores of AdminService, on a login of its own (a
// member of fanout_admin and nothing else): the node's login may not call
// an admin function, so they share no pool with Stores.
type AdminStores struct {
	Keys   *Keys
	Ledger *Ledger
	pool   *Pool
}

// OpenAdmin opens a small pool ("fanout-admin", 2 connections: admin calls
// are few) on databaseURL and builds AdminService's stores on it. Close
// closes it.
func OpenAdmin(ctx context.Context, databaseURL string) (*AdminStores, error) {
	pool, err := OpenPool(ctx, databaseURL, PoolConfig{MaxConns: 2, Name: "fanout-admin"})
	if err != nil {
		return nil, err
	}
	return &AdminStores{Keys: NewKeys(pool, nil), Ledger: NewLedger(pool), pool: pool}, nil
}

// Pool is the admin login's pool.
func (a *AdminStores) Pool() *Pool { return a.pool }

// Close closes the admin pool.
func (a *AdminStores) Close() {
	a.Ledger.Close()
	a.pool.Close()
}
