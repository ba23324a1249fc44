package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// backend is what every node in a process shares: the pool, the ledger, the
// exhaustion watcher and the lease sweeper.
type backend struct {
	url     string
	pool    *store.Pool
	ledger  *store.Ledger
	runs    *store.Runs
	watcher *budget.Watcher
	log     *slog.Logger
	tel     *telemetry

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// backendConfig tunes a backend.
type backendConfig struct {
	DatabaseURL   string
	SweepInterval time.Duration
	PollInterval  time.Duration
	GroupCommit   bool
	Logger        *slog.Logger
}

func startBackend(ctx context.Context, cfg backendConfig) (*backend, error) {
	pool, err := store.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	if owner, err := store.OwnsSchema(ctx, pool); err != nil {
		cfg.Logger.Warn("cannot tell whether this node connects as the schema's owner", "err", err)
	} else if owner {
		cfg.Logger.Warn("this node connects as the owner of schema " + store.Schema + ": it could change the ledger " +
			"outside its functions. Give nodes a login role that is only a member of fanout_app (docs/operations.md)")
	}
	ledger := store.NewLedgerWithConfig(pool, store.LedgerConfig{Coalesce: cfg.GroupCommit})
	w := budget.NewWatcher(store.NewWatchSource(pool, cfg.DatabaseURL), budget.WatcherConfig{
		PollInterval: cfg.PollInterval,
		Logger:       cfg.Logger,
	})
	bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	runs := store.NewRunsWithConfig(pool, store.RunsConfig{Coalesce: cfg.GroupCommit})
	b := &backend{url: cfg.DatabaseURL, pool: pool, ledger: ledger, runs: runs, watcher: w, log: cfg.Logger, cancel: cancel}
	b.wg.Add(2)
	go func() { defer b.wg.Done(); w.Run(bctx) }() //nolint:errcheck // returns ctx.Err()
	go func() { defer b.wg.Done(); budget.Sweep(bctx, ledger, cfg.SweepInterval, cfg.Logger) }()
	return b, nil
}

func (b *backend) close() {
	b.cancel()
	b.wg.Wait()
	b.ledger.Close()
	b.runs.Close()
	b.pool.Close()
	if b.tel != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		b.tel.shutdown(ctx)
	}
}

// grpcNode is one gRPC server with health and reflection, listening on addr.
type grpcNode struct {
	name   string
	srv    *grpc.Server
	health *health.Server
	lis    net.Listener
	done   chan error
	drain  func(context.Context) error // stops the service's own work
}

func listenGRPC(name, addr string, opts ...grpc.ServerOption) (*grpcNode, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: listen on %s: %w", name, addr, err)
	}
	srv := grpc.NewServer(append(opts, grpc.StatsHandler(otelgrpc.NewServerHandler()))...)
	h := health.NewServer()
	healthpb.RegisterHealthServer(srv, h)
	reflection.Register(srv)
	return &grpcNode{name: name, srv: srv, health: h, lis: lis, done: make(chan error, 1)}, nil
}

// Addr is the address the node listens on (with the real port for ":0").
func (n *grpcNode) Addr() string { return n.lis.Addr().String() }

func (n *grpcNode) serve(services ...string) {
	n.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	for _, s := range services {
		n.health.SetServingStatus(s, healthpb.HealthCheckResponse_SERVING)
	}
	go func() { n.done <- n.srv.Serve(n.lis) }()
}

// stop shuts the node down gracefully: health NOT_SERVING, the service's
// drain (bounded by grace), GracefulStop, and Stop if that overruns too.
func (n *grpcNode) stop(grace time.Duration) {
	n.health.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if n.drain != nil {
		n.drain(ctx) //nolint:errcheck // on timeout the drain cancels what is left itself
	}
	stopped := make(chan struct{})
	go func() { n.srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		n.srv.Stop()
		<-stopped
	}
}

// workerConfig configures one worker node.
type workerConfig struct {
	Listen   string
	Name     string // default: the listen address
	Capacity int
	LeaseTTL time.Duration
	Sim      llm.SimConfig
	// Providers adds the real providers whose keys env holds; nil: sim only.
	Providers *providerFlags
	Env       *Env
	// CaptureContent records prompt and completion text on spans.
	CaptureContent bool
	// CompressMaxTokens caps the compression call; 0: the default.
	CompressMaxTokens int
	// Trust is the worker's server TLS and the orchestrators' keys. Required.
	Trust nodeTrust
}

func startWorker(b *backend, cfg workerConfig) (*grpcNode, error) {
	if cfg.Trust.TLS == nil || cfg.Trust.Keys == nil {
		return nil, errors.New("worker: peer TLS and the orchestrators' signing keys are required")
	}
	n, err := listenGRPC("worker", cfg.Listen, grpc.Creds(credentials.NewTLS(cfg.Trust.TLS)))
	if err != nil {
		return nil, err
	}
	name := cfg.Name
	if name == "" {
		// Unique per process: the ledger tells holders apart by name, and
		// pods of one Deployment share their listen address.
		host, _ := os.Hostname()
		name = fmt.Sprintf("worker-%s-%d@%s", host, os.Getpid(), n.Addr())
	}
	sim, err := llm.NewSim(cfg.Sim)
	if err != nil {
		_ = n.lis.Close()
		return nil, err
	}
	models := subagent.SimModels(sim)
	if cfg.Providers != nil {
		if models, err = cfg.Providers.models(cfg.Env, b.pool, sim, b.log); err != nil {
			_ = n.lis.Close()
			return nil, err
		}
	}
	w, err := subagent.NewServer(subagent.ServerConfig{
		Ledger:            b.ledger,
		Keys:              cfg.Trust.Keys,
		Watcher:           b.watcher,
		Models:            models,
		Name:              name,
		Capacity:          cfg.Capacity,
		LeaseTTL:          cfg.LeaseTTL,
		CaptureContent:    cfg.CaptureContent,
		CompressMaxTokens: cfg.CompressMaxTokens,
		Logger:            b.log.With("worker", name),
	})
	if err != nil {
		_ = n.lis.Close()
		return nil, err
	}
	fanoutv1.RegisterSubagentServiceServer(n.srv, w)
	n.drain = w.Shutdown
	n.serve(fanoutv1.SubagentService_ServiceDesc.ServiceName)
	return n, nil
}

// orchestratorConfig configures one orchestrator node.
type orchestratorConfig struct {
	Listen  string
	Workers string // gRPC target: host:port,host:port or dns:///name:port
	Engine  orchestrator.Config
	// Trust is the orchestrator's client TLS and signing key. Required.
	Trust nodeTrust
}

// dialWorkers makes one client per address of a static list, or one
// round-robin client for a dns:/// target.
func dialWorkers(target string, tlsCfg *tls.Config) ([]orchestrator.Worker, func(), error) {
	if tlsCfg == nil {
		return nil, nil, errors.New("orchestrator: peer TLS is required to dial workers")
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"round_robin":{}}]}`),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler()), // carries the run's trace to the worker
	}
	var addrs []string
	if strings.Contains(target, ":///") {
		addrs = []string{target}
	} else {
		for _, a := range strings.Split(target, ",") {
			if a = strings.TrimSpace(a); a != "" {
				addrs = append(addrs, a)
			}
		}
	}
	if len(addrs) == 0 {
		return nil, nil, errors.New("--workers: need a gRPC target (host:port,host:port or dns:///name:port)")
	}
	var conns []*grpc.ClientConn
	closeAll := func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}
	var ws []orchestrator.Worker
	for _, a := range addrs {
		conn, err := grpc.NewClient(a, opts...)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("--workers %q: %w", a, err)
		}
		conn.Connect() // dial now, not on the first task
		conns = append(conns, conn)
		ws = append(ws, orchestrator.Worker{Addr: a, Client: fanoutv1.NewSubagentServiceClient(conn)})
	}
	return ws, closeAll, nil
}

func startOrchestrator(b *backend, cfg orchestratorConfig) (*grpcNode, error) {
	if cfg.Trust.Signer == nil {
		return nil, errors.New("orchestrator: a dispatch signing key is required")
	}
	ws, closeConns, err := dialWorkers(cfg.Workers, cfg.Trust.TLS)
	if err != nil {
		return nil, err
	}
	pool, err := orchestrator.NewWorkerPool(ws...)
	if err != nil {
		closeConns()
		return nil, err
	}
	if cfg.Engine.KnownTools == nil {
		cfg.Engine.KnownTools = subagent.BuiltinToolNames()
	}
	if cfg.Engine.Logger == nil {
		cfg.Engine.Logger = b.log
	}
	e, err := orchestrator.NewEngine(orchestrator.EngineParams{
		Store:   b.runs,
		Ledger:  b.ledger,
		Watcher: b.watcher,
		Workers: pool,
		Signer:  cfg.Trust.Signer,
		Config:  cfg.Engine,
	})
	if err != nil {
		closeConns()
		return nil, err
	}
	n, err := listenGRPC("orchestrator", cfg.Listen, orchestrator.ServerOptions(e)...)
	if err != nil {
		e.Shutdown(context.Background()) //nolint:errcheck // the engine never served; nothing to drain
		closeConns()
		return nil, err
	}
	fanoutv1.RegisterOrchestratorServiceServer(n.srv, orchestrator.NewServer(e))
	n.drain = func(ctx context.Context) error {
		defer closeConns()
		return e.Shutdown(ctx)
	}
	n.serve(fanoutv1.OrchestratorService_ServiceDesc.ServiceName)
	return n, nil
}
