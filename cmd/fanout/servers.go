package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/node"
	"github.com/fanout/fanout/orchestrator"
	"github.com/fanout/fanout/peer"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// serverFlags are the flags every server shares.
type serverFlags struct {
	listen        string
	databaseURL   string
	logLevel      string
	grace         time.Duration
	sweepInterval time.Duration
	pollInterval  time.Duration
	groupCommit   bool
	metricsListen string
	pprof         bool
	probeListen   string
	ledgerPool    int
	apiPool       int
	maxStreams    int
	tenantStreams int
	unauthBytes   int64
	reqBytes      int64
	tenantBytes   int64
	reqRead       time.Duration
	unauthWait    time.Duration
	health        time.Duration
	unsafeDurable bool
	asyncStandbys bool
}

func (s *serverFlags) register(f *flags, listen, metrics string) {
	f.StringVar(&s.listen, "listen", listen, "address to serve gRPC on (HOST:PORT)")
	f.StringVar(&s.metricsListen, "metrics-listen", metrics, "address to serve Prometheus /metrics on (empty: off)")
	f.BoolVar(&s.pprof, "pprof", false, "also serve Go's profiles (net/http/pprof) under /debug/pprof/ on --metrics-listen; off: they expose the process's memory and stacks")
	f.StringVar(&s.probeListen, "probe-listen", "", "address to serve the gRPC health service alone on, in plaintext, for Kubernetes probes (empty: off)")
	f.secretVar(&s.databaseURL, "database-url", "PostgreSQL URL (postgres://user:pass@host:5432/db)")
	f.alsoEnv("database-url", "DATABASE_URL")
	f.StringVar(&s.logLevel, "log-level", "info", "debug, info, warn or error")
	f.DurationVar(&s.grace, "shutdown-grace", defaultGrace, "how long to drain on SIGTERM before cancelling what is left")
	f.DurationVar(&s.sweepInterval, "sweep-interval", node.DefaultSweepInterval, "how often this node posts expired leases as estimated spend")
	f.DurationVar(&s.pollInterval, "poll-interval", budget.DefaultPollInterval, "how often watched runs are polled in case a NOTIFY was missed")
	f.BoolVar(&s.groupCommit, "group-commit", true, "coalesce ledger calls that arrive together into one transaction")
	f.IntVar(&s.ledgerPool, "db-pool-ledger", node.DefaultLedgerPool, "connections of the ledger's pool (reserve, settle, leases, watcher, sweeper, tool writes, slots, rate limits); API callers never use it")
	f.IntVar(&s.apiPool, "db-pool-api", node.DefaultAPIPool, "connections of the run store's pool (opening runs, tasks, events, GetRun/ListRuns/WatchRun reads, approvals, spend, API keys)")
	f.BoolVar(&s.unsafeDurable, "allow-unsafe-durability", false, "start even when the database's settings can lose a grant it acknowledged (fsync, full_page_writes, synchronous_commit off; asynchronous standbys; docs/operations.md#ha-postgresql): each problem is logged as an error instead. For throwaway databases only")
	f.BoolVar(&s.asyncStandbys, "allow-async-standbys", false, "start with asynchronous standbys streaming (read replicas that are never promoted, the failover handled synchronously elsewhere, as RDS Multi-AZ with a read replica); the other durability checks still refuse")
	f.DurationVar(&s.health, "health-interval", time.Minute, "how often this node checks the database for the alerts (conservation, overdue leases, stale runs; reads the whole journal); 0: off")
	f.IntVar(&s.maxStreams, "max-streams", node.DefaultMaxStreams, "most gRPC calls this process serves at once, all connections together (health checks aside); more are RESOURCE_EXHAUSTED")
	f.IntVar(&s.tenantStreams, "tenant-max-streams", 0, "most calls one tenant holds at once on this process once authenticated (orchestrator with --auth keys); more are RESOURCE_EXHAUSTED; 0: a quarter of --max-streams")
	f.Int64Var(&s.unauthBytes, "unauthenticated-bytes", node.DefaultUnauthenticatedBytes, "budget of the calls an orchestrator with --auth keys admits before it has verified their keys (the key's lookup; health and reflection calls), each counted at the receive limit (8 MiB by default), 64 calls at the most; more are RESOURCE_EXHAUSTED before their bodies are read")
	f.Int64Var(&s.reqBytes, "request-bytes", node.DefaultRequestBytes, "most bytes of requests an orchestrator holds in memory at once, gRPC and HTTP together, each request charged before its body is read (docs/operations.md \"Memory\"); a request waits for its share up to 5s, then is RESOURCE_EXHAUSTED")
	f.DurationVar(&s.reqRead, "request-read-timeout", node.DefaultRequestReadTimeout, "how long a request holding its share of --request-bytes may take to be sent; a call still sending then is ended and its share given back")
	f.Int64Var(&s.tenantBytes, "tenant-request-bytes", node.DefaultTenantRequestBytes, "one tenant's share of --request-bytes (an admin key's; the anonymous callers' with --auth none); at least 4 × the HTTP body limit (64 MiB + 4 KiB with the default spec limit)")
	f.DurationVar(&s.unauthWait, "unauthenticated-read-timeout", node.DefaultUnauthenticatedReadTimeout, "how long a call read before authentication may take to send its request (orchestrator with --auth keys); a call still unauthenticated then is ended and its share of --unauthenticated-bytes given back")
}

func (s *serverFlags) backendConfig(log *slog.Logger) node.BackendConfig {
	return node.BackendConfig{
		DatabaseURL:                s.databaseURL,
		SweepInterval:              s.sweepInterval,
		PollInterval:               s.pollInterval,
		GroupCommit:                s.groupCommit,
		LedgerPool:                 int32(min(max(s.ledgerPool, 0), 1<<20)), //nolint:gosec // clamped
		APIPool:                    int32(min(max(s.apiPool, 0), 1<<20)),    //nolint:gosec // clamped
		MaxStreams:                 s.maxStreams,
		TenantMaxStreams:           s.tenantStreams,
		UnauthenticatedBytes:       s.unauthBytes,
		UnauthenticatedReadTimeout: s.unauthWait,
		RequestBytes:               s.reqBytes,
		TenantRequestBytes:         s.tenantBytes,
		RequestReadTimeout:         s.reqRead,
		// 0 turns the check off here; BackendConfig's 0 is its default.
		HealthInterval:    cmp.Or(s.health, -1),
		RequireDurability: !s.unsafeDurable,
		AsyncStandbys:     s.asyncStandbys,
		Logger:            log,
	}
}

// process is one server process: its telemetry and its node.Main.
type process struct {
	*node.Main
	log   *slog.Logger
	tel   *telemetry
	grace time.Duration
}

// start sets up telemetry (named service) and opens cfg's servers on the
// backend the flags describe. Call stop when done.
func (s *serverFlags) start(ctx context.Context, env *Env, service string, cfg node.Config) (*process, error) {
	if s.databaseURL == "" {
		return nil, fmt.Errorf("--database-url or --database-url-file (or DATABASE_URL, FANOUT_DATABASE_URL_FILE) is required")
	}
	log := newLogger(env.Stderr, s.logLevel)
	tel, err := setupTelemetry(ctx, env, service, s.metricsListen, s.pprof, log)
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if tel.addr != "" {
		log.Info("metrics", "addr", "http://"+tel.addr+"/metrics")
	}
	cfg.Backend = s.backendConfig(log)
	m := node.NewMain(cfg)
	if err := m.Open(ctx); err != nil {
		tel.shutdown(ctx)
		return nil, err
	}
	return &process{Main: m, log: log, tel: tel, grace: s.grace}, nil
}

// wait serves until ctx ends (SIGTERM, Ctrl-C) or a server fails.
func (p *process) wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		p.log.Info("shutting down", "grace", p.grace)
		return nil
	case err := <-p.Err():
		return fmt.Errorf("server stopped: %w", err)
	}
}

// stop drains and stops the servers within the grace, then flushes telemetry.
func (p *process) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), p.grace)
	defer cancel()
	p.Close(ctx) //nolint:errcheck // on timeout the drains cancel what is left themselves
	tctx, tcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer tcancel()
	p.tel.shutdown(tctx)
}

// defaultMaxRunTokens caps a run's budget when the operator names no cap:
// a run of 256 tasks at 390k tokens each. A budget of 2^63-1 is a mistake.
const defaultMaxRunTokens = 100_000_000

// minConcurrencyInterval is the shortest --concurrency-interval: each
// interval an orchestrator reads the rate limits and counts the running
// runs once per provider and model its runs call.
const minConcurrencyInterval = time.Second

// registerEngineFlags registers the orchestrator's limits; call the
// returned func after parsing to check them and copy them into c.
func registerEngineFlags(f *flags, c *orchestrator.Config) func() error {
	def := orchestrator.DefaultConfig()
	f.IntVar(&c.MaxTasks, "max-tasks", def.MaxTasks, "most tasks in one run (more is RESOURCE_EXHAUSTED)")
	f.Int64Var(&c.MaxRunTokens, "max-run-tokens", defaultMaxRunTokens, "the largest budget.limit_tokens of any run (more is RESOURCE_EXHAUSTED; a tenant's max_run_tokens may lower it; 0: no cap)")
	concurrency := f.Int("default-concurrency", int(def.DefaultConcurrency), "subagents of one run at once when the run sets none and no rate limit of its model is known")
	maxConcurrency := f.Int("max-concurrency", int(def.MaxConcurrency), "most subagents of one run at once, whatever the run asks")
	f.Float64Var(&c.DefaultHeadroom, "headroom", def.DefaultHeadroom, "the share of a provider's stated rate limit runs that set no concurrency plan to use, for a tenant that sets none (0 < h <= 1)")
	f.DurationVar(&c.ConcurrencyInterval, "concurrency-interval", def.ConcurrencyInterval, "how often a run that sets no concurrency reads the rate limits again and resizes")
	f.Int64Var(&c.DefaultMinReservation, "min-reservation", def.DefaultMinReservation, "a run's min_reservation_tokens when it sets none")
	f.DurationVar(&c.DefaultTaskTimeout, "task-timeout", def.DefaultTaskTimeout, "a task's timeout when it sets none")
	f.DurationVar(&c.DefaultRunTimeout, "run-timeout", def.DefaultRunTimeout, "a run's timeout when it sets none")
	f.DurationVar(&c.HeartbeatInterval, "heartbeat-interval", def.HeartbeatInterval, "how often this replica renews the lease of the runs it drives")
	f.DurationVar(&c.OrphanAfter, "orphan-after", def.OrphanAfter, "a run whose lease is this stale (database time) is adopted and resumed by a live replica; same on every replica")
	return func() error {
		c.DefaultConcurrency, c.MaxConcurrency = int32(*concurrency), int32(*maxConcurrency)
		// !(h > 0) refuses NaN too, which every comparison is false for.
		if !(c.DefaultHeadroom > 0) || c.DefaultHeadroom > 1 {
			return fmt.Errorf("--headroom %v: must be in (0, 1], the share of a provider's stated rate limit runs use", c.DefaultHeadroom)
		}
		if c.ConcurrencyInterval < minConcurrencyInterval {
			return fmt.Errorf("--concurrency-interval %v: must be at least %v", c.ConcurrencyInterval, minConcurrencyInterval)
		}
		return nil
	}
}

type simFlags struct {
	latency time.Duration
	tools   int
	finish  int
	output  int
	logPath string
	seed    int64
}

func (s *simFlags) register(f *flags) {
	f.DurationVar(&s.latency, "sim-latency", 400*time.Millisecond, "latency of each call of the sim model")
	f.IntVar(&s.tools, "sim-tool-calls", 2, "tool calls the sim model makes per iteration")
	f.IntVar(&s.finish, "sim-finish-after", 3, "iteration at which the sim model answers")
	f.IntVar(&s.output, "sim-output-tokens", 300, "output tokens the sim model reports per call")
	f.StringVar(&s.logPath, "sim-log", "", "append every sim call (start, end, run, task, reservation) to this JSON-lines file")
	f.Int64Var(&s.seed, "sim-seed", 1, "the sim model's seed when a run sets none")
}

func (s *simFlags) config() llm.SimConfig {
	return llm.SimConfig{Latency: s.latency, ToolCallsPerIteration: s.tools, FinishAfter: s.finish,
		OutputTokens: s.output, LogPath: s.logPath, Seed: s.seed}
}

const orchestratorUsage = `
Serve fanout.v1.OrchestratorService: accept runs, dispatch their tasks to workers,
cancel on budget exhaustion, join the results. Stateless: run as many replicas as
you like against one Postgres; any replica answers GetRun, WatchRun and CancelRun.

Usage:
  fanout orchestrator --database-url URL --workers TARGET [flags]

Example:
  fanout orchestrator --listen 0.0.0.0:50051 \
    --database-url postgres://fanout@db:5432/fanout --workers dns:///fanout-workers:50052
`

// orchestratorCommand is what `fanout orchestrator`'s flags configure.
type orchestratorCommand struct {
	sf serverFlags
	oc node.OrchestratorConfig
	tf toolFlags
	pf peerFlags
	cf callerFlags
}

// parseOrchestrator parses `fanout orchestrator`'s flags (and environment)
// into its config, without reading any file.
func parseOrchestrator(env *Env, args []string) (*orchestratorCommand, error) {
	c := &orchestratorCommand{}
	f := newFlags("orchestrator", orchestratorUsage, env.Stderr)
	c.sf.register(f, "127.0.0.1:50051", "127.0.0.1:9464")
	f.StringVar(&c.oc.Workers, "workers", "", "workers' gRPC target: host:port,host:port or dns:///name:port")
	f.StringVar(&c.oc.Engine.Node, "name", "", "this replica's name, as owner of the runs it drives (default hostname-pid; make it unique per process)")
	f.secretVar(&c.oc.AdminDatabaseURL, "admin-database-url", "PostgreSQL URL of a login in role fanout_admin, for AdminService (empty: AdminService is off)")
	f.alsoEnv("admin-database-url", "ADMIN_DATABASE_URL")
	applyEngine := registerEngineFlags(f, &c.oc.Engine)
	c.tf.registerConfig(f)
	c.pf.register(f, peer.RoleOrchestrator)
	c.cf.register(f)
	if err := parseFlags(f, args, env); err != nil {
		return nil, err
	}
	if err := applyEngine(); err != nil {
		return nil, err
	}
	c.oc.Listen, c.oc.ProbeListen = c.sf.listen, c.sf.probeListen
	return c, nil
}

func cmdOrchestrator(ctx context.Context, env *Env, args []string) error {
	c, err := parseOrchestrator(env, args)
	if err != nil {
		return err
	}
	oc := c.oc
	if oc.Auth, err = c.cf.config(); err != nil {
		return err
	}
	if oc.HTTP, err = c.cf.http(); err != nil {
		return err
	}
	if oc.MCPTools, oc.ToolPolicy, err = c.tf.toolNames(); err != nil {
		return err
	}
	if oc.Workers == "" {
		return errors.New("--workers: need a gRPC target (host:port,host:port or dns:///name:port)")
	}
	if oc.Trust, err = c.pf.orchestratorTrust(); err != nil {
		return err
	}
	p, err := c.sf.start(ctx, env, "fanout-orchestrator", node.Config{Orchestrator: &oc})
	if err != nil {
		return err
	}
	defer p.stop()
	attrs := []any{"addr", p.Orchestrator().Addr(), "workers", oc.Workers}
	if addr := p.Orchestrator().HTTPAddr(); addr != "" {
		attrs = append(attrs, "http", httpURL(addr, oc.Auth.TLS != nil))
		if oc.HTTP.Console != nil {
			attrs = append(attrs, "console", httpURL(addr, oc.Auth.TLS != nil)+"/console/")
		}
	}
	p.log.Info("orchestrator serving", attrs...)
	return p.wait(ctx)
}

const workerUsage = `
Serve fanout.v1.SubagentService: run subagents (the agent loop), paying every model
call from the shared ledger, and cancel local subagents of a run whose budget ended.

Usage:
  fanout worker --database-url URL [flags]

Example:
  fanout worker --listen 0.0.0.0:50052 --database-url postgres://fanout@db:5432/fanout --capacity 128
`

// workerCommand is what `fanout worker`'s flags configure.
type workerCommand struct {
	sf   serverFlags
	wc   node.WorkerConfig
	prov providerFlags
	tf   toolFlags
	pf   peerFlags
}

// parseWorker parses `fanout worker`'s flags (and environment) into its
// config, without reading any file: Trust and MCP are left to cmdWorker.
func parseWorker(env *Env, args []string) (*workerCommand, error) {
	c := &workerCommand{}
	f := newFlags("worker", workerUsage, env.Stderr)
	c.sf.register(f, "127.0.0.1:50052", "127.0.0.1:9465")
	def := subagent.DefaultServerConfig()
	f.StringVar(&c.wc.Server.Name, "name", "", "worker name in the ledger and events, unique per process (default worker-HOSTNAME-PID@ADDR)")
	f.IntVar(&c.wc.Server.Capacity, "capacity", def.Capacity, "most subagents at once; beyond it the worker answers RESOURCE_EXHAUSTED")
	f.DurationVar(&c.wc.Server.LeaseTTL, "lease-ttl", def.LeaseTTL, "lease of each reservation; renewed during long calls")
	f.DurationVar(&c.wc.MaxConnectionAge, "max-connection-age", node.DefaultMaxConnectionAge,
		"an orchestrator's connection lives this long, then reconnects (calls in flight finish): how soon a dns:/// orchestrator finds a new worker")
	f.BoolVar(&c.wc.Server.CaptureContent, "capture-content", false, "record prompt and completion text on traces (off: never recorded)")
	f.IntVar(&c.wc.Server.CompressMaxTokens, "compress-max-tokens", def.CompressMaxTokens, "output cap of the structured-output call that compresses a subagent's work (real providers)")
	var sim simFlags
	sim.register(f)
	c.prov.register(f)
	c.tf.register(f)
	c.pf.register(f, peer.RoleWorker)
	if err := parseFlags(f, args, env); err != nil {
		return nil, err
	}
	c.tf.apply(&c.wc.Server)
	c.wc.Listen, c.wc.ProbeListen, c.wc.Sim, c.wc.ModelsFunc = c.sf.listen, c.sf.probeListen, sim.config(), c.prov.modelsFunc(env)
	return c, nil
}

func cmdWorker(ctx context.Context, env *Env, args []string) error {
	c, err := parseWorker(env, args)
	if err != nil {
		return err
	}
	wc := c.wc
	if wc.Trust, err = c.pf.workerTrust(); err != nil {
		return err
	}
	if wc.MCP, err = c.tf.load(); err != nil {
		return err
	}
	p, err := c.sf.start(ctx, env, "fanout-worker", node.Config{Workers: []node.WorkerConfig{wc}})
	if err != nil {
		return err
	}
	defer p.stop()
	p.log.Info("worker serving", "addr", p.Workers()[0].Addr())
	return p.wait(ctx)
}

const migrateUsage = `
Apply the database schema under an advisory lock, so replicas starting together are safe:
the versioned migrations not applied yet (tables, columns, data; forward only), then,
when any of their files changed, every function and view definition as one set.
A database older than schema 21 is refused: upgrade it with an earlier release first
(docs/operations.md, "Upgrading").

Usage:
  fanout migrate --database-url URL

Example:
  DATABASE_URL=postgres://fanout@db:5432/fanout fanout migrate
`

func cmdMigrate(ctx context.Context, env *Env, args []string) error {
	f := newFlags("migrate", migrateUsage, env.Stderr)
	var url string
	f.secretVar(&url, "database-url", "PostgreSQL URL")
	f.alsoEnv("database-url", "DATABASE_URL")
	if err := parseFlags(f, args, env); err != nil {
		return err
	}
	if url == "" {
		return fmt.Errorf("--database-url or --database-url-file (or DATABASE_URL, FANOUT_DATABASE_URL_FILE) is required")
	}
	done, err := store.Apply(ctx, url)
	if err != nil {
		return err
	}
	if len(done.Versions) > 0 {
		fmt.Fprintf(env.Stdout, "versioned migrations applied: %v\n", done.Versions)
	}
	switch {
	case done.Redefined && len(done.Changed) > 6:
		fmt.Fprintf(env.Stdout, "definitions applied (%d files changed or new, among them %s, …)\n",
			len(done.Changed), strings.Join(done.Changed[:3], ", "))
	case done.Redefined && len(done.Changed) > 0:
		fmt.Fprintf(env.Stdout, "definitions applied again (changed: %s)\n", strings.Join(done.Changed, ", "))
	case done.Redefined:
		fmt.Fprintln(env.Stdout, "definitions applied again (after the versioned migrations)")
	}
	if len(done.Dropped) > 0 {
		fmt.Fprintf(env.Stdout, "dropped, no file defines them any more: %s\n", strings.Join(done.Dropped, ", "))
	}
	if len(done.Versions) == 0 && !done.Redefined {
		fmt.Fprintln(env.Stdout, "schema up to date: nothing to apply")
	}
	return nil
}
