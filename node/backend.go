// Package node wires fanout's servers — the database backend one process
// shares, workers and orchestrators on real gRPC — as cmd/fanout runs them
// and as the tests start them on :0 ports.
//
// Only cmd and tests import node: the engine packages never see it.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store"
)

// DefaultSweepInterval is how often a backend posts expired leases as
// estimated spend when its config sets no interval.
const DefaultSweepInterval = 2 * time.Second

// Pool sizes when BackendConfig sets none.
const (
	DefaultLedgerPool = 16
	DefaultAPIPool    = 8
)

// BackendConfig configures a Backend. Zero values take the documented defaults.
type BackendConfig struct {
	// DatabaseURL is the PostgreSQL URL the nodes log in with: a member of
	// fanout_app, not the schema's owner (a warning says so otherwise). Required.
	DatabaseURL string
	// SweepInterval is how often this process posts reservations whose
	// lease ran out (database time) as estimated spend. Default
	// DefaultSweepInterval.
	SweepInterval time.Duration
	// PollInterval is how often the exhaustion watcher polls the runs it
	// watches, in case a NOTIFY was missed. Default: budget.WatcherConfig's.
	PollInterval time.Duration
	// GroupCommit coalesces the ledger and run-store calls that arrive
	// together into one transaction (store.LedgerConfig.Coalesce). Off
	// when false; cmd/fanout turns it on by default.
	GroupCommit bool
	// LedgerPool is the size of the ledger's connection pool: reservations,
	// settlements, lease renewals, the exhaustion watcher, the sweeper, a
	// worker's tool writes, semaphore slots and provider rate limits.
	// Nothing an API caller asks for waits on it (store.Stores says which
	// store is on which pool, and why). Default DefaultLedgerPool. It wins
	// over the URL's pool_max_conns.
	LedgerPool int32
	// APIPool is the size of the run store's pool: opening runs, tasks and
	// events, the reads of GetRun, ListRuns and WatchRun, approvals, spend
	// and API keys. Callers that exhaust it slow those, never the ledger.
	// Default DefaultAPIPool.
	APIPool int32
	// MaxStreams is the most calls (unary or streaming, health checks aside)
	// the process's servers serve at once, across all connections; more are
	// refused RESOURCE_EXHAUSTED. Default DefaultMaxStreams.
	MaxStreams int
	// TenantMaxStreams is the most calls (unary or streaming) one tenant
	// holds at once on this process once authenticated, so that one
	// tenant's flood never takes the slots of MaxStreams another tenant's
	// call needs; more are refused RESOURCE_EXHAUSTED with a QuotaFailure
	// on "tenant:ID". An admin key is held to it on its own. Default a
	// quarter of MaxStreams (at least 1). Not applied with --auth none.
	TenantMaxStreams int
	// UnauthenticatedBytes is the budget of the calls an orchestrator with
	// API keys reads before it knows who sent them (a key not yet verified;
	// health and reflection have a budget of the same size of their own).
	// Each is charged the server's receive limit, since its size is unknown
	// before it is read; a call past the budget is refused
	// RESOURCE_EXHAUSTED before its body is read, and a call with no
	// credential is refused UNAUTHENTICATED there. Default
	// DefaultUnauthenticatedBytes.
	UnauthenticatedBytes int64
	// UnauthenticatedReadTimeout is how long a call admitted against that
	// budget may take to be authenticated (for a unary call: to send its
	// whole request). A call still unauthenticated then is ended, and its
	// share given back: a caller that sends headers and then a trickle
	// holds a share for this long at most. Default
	// DefaultUnauthenticatedReadTimeout.
	UnauthenticatedReadTimeout time.Duration
	// RequestBytes is the most bytes of requests an orchestrator holds in
	// memory at once, read or being read, decoded or being decoded, over
	// gRPC and HTTP together (--request-bytes; docs/operations.md
	// "Memory"). Default DefaultRequestBytes.
	RequestBytes int64
	// TenantRequestBytes is one tenant's share of RequestBytes (an admin
	// key's, the anonymous callers' of --auth none) (--tenant-request-bytes).
	// Default DefaultTenantRequestBytes.
	TenantRequestBytes int64
	// RequestBytesWait is how long a request waits for its share before it
	// is refused RESOURCE_EXHAUSTED. Default DefaultRequestBytesWait.
	RequestBytesWait time.Duration
	// RequestReadTimeout is how long a request holding its charge may take
	// to be sent (--request-read-timeout); a call still sending then is
	// ended and its charge given back. Default DefaultRequestReadTimeout.
	RequestReadTimeout time.Duration
	// HealthInterval is how often this process checks the database's health
	// (store.MonitorHealth: conservation, overdue leases, stale runs) for the
	// alerts of deploy/prometheus. Default store.HealthConfig's (1m);
	// negative: off.
	HealthInterval time.Duration
	// WorkersOnly: the process serves workers and no orchestrator (Main
	// sets it so). Its LISTEN connection does not listen on run events
	// (store.WorkerListenStatement): only orchestrators' WatchRun
	// followers hear them, and a session listening on a channel it never
	// reads holds PostgreSQL's notification queue. An orchestrator cannot
	// be opened on such a backend.
	WorkersOnly bool
	// RequireDurability refuses to open the backend on a database whose
	// settings can lose a commit it acknowledged, on a crash or a failover
	// (store.Durability.Problems; docs/operations.md#ha-postgresql). When
	// false each problem is logged as an error and the backend opens.
	// cmd/fanout sets it unless --allow-unsafe-durability.
	RequireDurability bool
	// AsyncStandbys accepts asynchronous standbys (read replicas that are
	// never promoted; --allow-async-standbys), and only them, among the
	// durability problems.
	AsyncStandbys bool
	// Logger receives the backend's and its nodes' logs. Default slog.Default().
	Logger *slog.Logger
}

// Backend is what every node of one process shares: the stores, each built
// once on its pool (store.Stores: the ledger's pool, the API's), the
// exhaustion watcher, the lease sweeper and the cap on calls in flight.
type Backend struct {
	stores *store.Stores
	// workersOnly is BackendConfig.WorkersOnly.
	workersOnly bool
	streams     *streamLimit
	// tenants caps each tenant's calls; unauthBytes is the budget of
	// unauthenticated calls (BackendConfig.UnauthenticatedBytes), and
	// unauthWait how long one may hold its share.
	tenants     *tenantLimit
	unauthBytes int64
	unauthWait  time.Duration
	// reqBytes is the request-bytes budget's configuration.
	reqBytes struct {
		total, perTenant int64
		wait, read       time.Duration
	}
	// httpLimits are the HTTP listeners' timeouts (tests shorten them).
	httpLimits httpLimits
	watcher    *budget.Watcher
	log        *slog.Logger

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// OpenBackend connects to cfg.DatabaseURL and starts the watcher and the
// sweeper. Call Close to stop them.
func OpenBackend(ctx context.Context, cfg BackendConfig) (*Backend, error) {
	if cfg.DatabaseURL == "" {
		return nil, errors.New("open backend: a database URL is required")
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = DefaultSweepInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.LedgerPool <= 0 {
		cfg.LedgerPool = DefaultLedgerPool
	}
	if cfg.APIPool <= 0 {
		cfg.APIPool = DefaultAPIPool
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = DefaultMaxStreams
	}
	if cfg.UnauthenticatedBytes <= 0 {
		cfg.UnauthenticatedBytes = DefaultUnauthenticatedBytes
	}
	if cfg.UnauthenticatedReadTimeout <= 0 {
		cfg.UnauthenticatedReadTimeout = DefaultUnauthenticatedReadTimeout
	}
	if cfg.RequestBytes <= 0 {
		cfg.RequestBytes = DefaultRequestBytes
	}
	if cfg.TenantRequestBytes <= 0 {
		cfg.TenantRequestBytes = min(DefaultTenantRequestBytes, cfg.RequestBytes)
	}
	if cfg.RequestBytesWait <= 0 {
		cfg.RequestBytesWait = DefaultRequestBytesWait
	}
	if cfg.RequestReadTimeout <= 0 {
		cfg.RequestReadTimeout = DefaultRequestReadTimeout
	}
	st, err := store.OpenStores(ctx, store.StoresConfig{DatabaseURL: cfg.DatabaseURL, LedgerPool: cfg.LedgerPool,
		APIPool: cfg.APIPool, GroupCommit: cfg.GroupCommit, Logger: cfg.Logger, WorkersOnly: cfg.WorkersOnly})
	if err != nil {
		return nil, err
	}
	if err := checkDurability(ctx, st.LedgerPool(), cfg.RequireDurability, cfg.AsyncStandbys, cfg.Logger); err != nil {
		st.Close()
		return nil, err
	}
	if owner, err := store.OwnsSchema(ctx, st.LedgerPool()); err != nil {
		cfg.Logger.Warn("cannot tell whether this node connects as the schema's owner", "err", err)
	} else if owner {
		cfg.Logger.Warn("this node connects as the owner of schema " + store.Schema + ": it could change the ledger " +
			"outside its functions. Give nodes a login role that is only a member of fanout_app (docs/operations.md)")
	}
	b := &Backend{
		stores:      st,
		workersOnly: cfg.WorkersOnly,
		streams:     newStreamLimit(cfg.MaxStreams),
		tenants:     newTenantLimit(tenantQuota(cfg.MaxStreams, cfg.TenantMaxStreams)),
		unauthBytes: cfg.UnauthenticatedBytes,
		unauthWait:  cfg.UnauthenticatedReadTimeout,
		httpLimits:  defaultHTTPLimits,
		reqBytes: struct {
			total, perTenant int64
			wait, read       time.Duration
		}{cfg.RequestBytes, cfg.TenantRequestBytes, cfg.RequestBytesWait, cfg.RequestReadTimeout},
		watcher: budget.NewWatcher(st.Watch, budget.WatcherConfig{
			PollInterval: cfg.PollInterval,
			Logger:       cfg.Logger,
		}),
		log: cfg.Logger,
	}
	// The backend outlives the call that opened it: Close stops it.
	bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	b.cancel = cancel
	b.wg.Add(3)
	go func() { defer b.wg.Done(); st.Notifier.Run(bctx) }() //nolint:errcheck // returns nil when bctx ends
	go func() { defer b.wg.Done(); b.watcher.Run(bctx) }()   //nolint:errcheck // returns ctx.Err()
	go func() {
		defer b.wg.Done()
		budget.SweepWithConfig(bctx, st.Ledger, budget.SweepConfig{Interval: cfg.SweepInterval, Logger: cfg.Logger,
			ExpiredFunc: store.CountExpiredLeases})
	}()
	if cfg.HealthInterval >= 0 {
		b.wg.Go(func() {
			store.MonitorHealth(bctx, st.LedgerPool(), store.HealthConfig{Interval: cfg.HealthInterval, Logger: cfg.Logger})
		})
	}
	return b, nil
}

// Stores are the backend's stores, shared by its nodes: which pool each is
// on, and why, is store.Stores'.
func (b *Backend) Stores() *store.Stores { return b.stores }

// Pool is the ledger's connection pool (the watcher, the sweeper, the
// health checks and the providers' rate limits use it too).
func (b *Backend) Pool() *store.Pool { return b.stores.LedgerPool() }

// APIPool is the run store's connection pool, which API reads use.
func (b *Backend) APIPool() *store.Pool { return b.stores.APIPool() }

// Ledger is the backend's ledger, shared by its nodes.
func (b *Backend) Ledger() *store.Ledger { return b.stores.Ledger }

// Runs is the backend's run store, shared by its orchestrators.
func (b *Backend) Runs() *store.Runs { return b.stores.Runs }

// Watcher is the backend's exhaustion watcher, shared by its nodes.
func (b *Backend) Watcher() *budget.Watcher { return b.watcher }

// Logger is the logger of the backend and its nodes.
func (b *Backend) Logger() *slog.Logger { return b.log }

// Close stops the watcher and the sweeper, flushes the ledger's and the run
// store's pending batches and closes the pools. Stop the backend's nodes first.
func (b *Backend) Close() {
	b.cancel()
	b.wg.Wait()
	b.stores.Close()
}

// checkDurability reads the database's durability settings on the node's
// login, logs them, and refuses (required) or logs as an error each way
// they can lose an acknowledged commit.
func checkDurability(ctx context.Context, pool *store.Pool, required, asyncStandbys bool, log *slog.Logger) error {
	d, err := store.ReadDurability(ctx, pool)
	if err != nil {
		return err
	}
	problems := d.Problems(asyncStandbys)
	if len(problems) == 0 {
		log.Info("database durability", "settings", d.Summary())
		return nil
	}
	if required {
		return fmt.Errorf("the database can lose a grant it acknowledged (%s):\n  - %s\n"+
			"fix the settings (docs/operations.md#ha-postgresql), or pass --allow-unsafe-durability "+
			"(FANOUT_ALLOW_UNSAFE_DURABILITY=1) to run anyway on a throwaway database",
			d.Summary(), strings.Join(problems, "\n  - "))
	}
	log.Error("UNSAFE DATABASE DURABILITY: a grant the ledger acknowledged can be lost (running anyway: --allow-unsafe-durability)",
		"problems", problems, "settings", d.Summary())
	return nil
}
