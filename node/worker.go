package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
	"github.com/fanout/fanout/subagent/mcp"
)

// WorkerConfig configures a Worker. Zero values take the documented defaults.
type WorkerConfig struct {
	// Listen is the gRPC address (HOST:PORT). Default 127.0.0.1:0, a free
	// loopback port.
	Listen string
	// ProbeListen, if set, is where the health service is served alone, in
	// plaintext, for the kubelet's gRPC probes (the worker's own port
	// admits only orchestrators). Default: off.
	ProbeListen string
	// Trust is the worker's side of the peer trust: mutual TLS that admits
	// only orchestrators, and their dispatch keys. Required.
	Trust WorkerTrust
	// MaxConnectionAge is how long an orchestrator's connection to this
	// worker lives before the worker asks it to reconnect (a GOAWAY; calls
	// in flight run to their end on the old connection). A dns:/// client
	// resolves its target again only when a connection ends, so this bounds
	// how long a worker added behind a headless Service (a scale-up, a pod
	// that became ready after the orchestrator resolved) goes unused.
	// Default DefaultMaxConnectionAge; gRPC adds ±10% jitter.
	MaxConnectionAge time.Duration
	// Sim configures the deterministic sim model every worker has.
	Sim llm.SimConfig
	// ModelsFunc builds the worker's models around its sim (adding real
	// providers). Default: the sim only.
	ModelsFunc func(b *Backend, sim llm.Model) (subagent.ModelFunc, error)
	// MCP, if not nil, are the MCP servers whose tools the worker's
	// subagents may call, besides the built-ins (mcp.Load). The worker
	// connects to each at start and fails to start if one cannot be reached
	// or lacks a configured tool.
	MCP *mcp.Config
	// Server tunes the subagent server (capacity, lease TTL, ...; its
	// defaults are subagent.ServerConfig's). Open sets Keys from Trust and
	// fills what is unset: Ledger and Watcher (the backend's), Models (from
	// Sim and ModelsFunc), Name (worker-HOST-PID@ADDR: unique per process,
	// as the ledger tells holders apart by name) and Logger (the backend's).
	Server subagent.ServerConfig
}

// DefaultMaxConnectionAge is WorkerConfig.MaxConnectionAge's default: a new
// worker behind a dns:/// target takes work within about this long.
const DefaultMaxConnectionAge = 30 * time.Second

// Worker serves fanout.v1.SubagentService: it runs subagents for the
// orchestrators, paying every model call from the backend's ledger.
type Worker struct {
	srv   *server
	sub   *subagent.Server
	sim   *llm.Sim
	tools *workerTools
	name  string
}

// OpenWorker starts a worker on b and returns once it serves. Call Close to stop it.
func OpenWorker(ctx context.Context, b *Backend, cfg WorkerConfig) (*Worker, error) {
	return openWorker(ctx, b, cfg, make(chan error, 1), true)
}

// openWorker opens a worker on b. alone: no orchestrator shares its
// process (and so its login).
func openWorker(ctx context.Context, b *Backend, cfg WorkerConfig, exited chan<- error, alone bool) (*Worker, error) {
	if cfg.MaxConnectionAge < 0 || (cfg.MaxConnectionAge > 0 && cfg.MaxConnectionAge < time.Second) {
		return nil, fmt.Errorf("worker: max connection age %s: must be at least 1s (or 0 for the default %s)", cfg.MaxConnectionAge, DefaultMaxConnectionAge)
	}
	if cfg.Trust.TLS == nil || cfg.Trust.Keys == nil {
		return nil, errors.New("worker: peer TLS and the orchestrators' signing keys are required")
	}
	// One orchestrator holds one connection to a worker: let it fill the
	// worker's capacity on it.
	perConn := uint32(max(StreamsPerConn, cfg.Server.Capacity)) //nolint:gosec // a capacity is far below 2^32
	ka := b.streams.keepalive
	ka.MaxConnectionAge = cmp.Or(cfg.MaxConnectionAge, DefaultMaxConnectionAge)
	srv, err := listen("worker", cfg.Listen, b.streams, exited, grpc.Creds(credentials.NewTLS(cfg.Trust.TLS)),
		grpc.MaxConcurrentStreams(perConn), grpc.KeepaliveParams(ka))
	if err != nil {
		return nil, err
	}
	if cfg.ProbeListen != "" {
		if _, err := srv.serveProbe(cfg.ProbeListen); err != nil {
			srv.close()
			return nil, err
		}
	}
	w, err := newWorker(ctx, b, cfg, srv.addr())
	if err != nil {
		srv.close()
		return nil, err
	}
	// An orchestrator's login is not asked for the attempts' secrets (it
	// begins attempts): a worker on one is not held to its dispatches. (In
	// a process that serves an orchestrator too, as `fanout dev` does, the
	// login is the orchestrator's anyway.)
	if alone {
		if in, err := store.InGroup(ctx, b.Pool(), "fanout_app"); err == nil && in {
			b.log.Warn("this worker logs in as a member of fanout_app, an orchestrator's group: the database does not hold it " +
				"to the tasks dispatched to it. Give workers a login that is only in fanout_worker (docs/operations.md)")
		}
	}
	w.srv = srv
	fanoutv1.RegisterSubagentServiceServer(srv.srv, w.sub)
	srv.serve(fanoutv1.SubagentService_ServiceDesc.ServiceName)
	return w, nil
}

// newWorker builds the worker's model and subagent server for one listening on addr.
func newWorker(ctx context.Context, b *Backend, cfg WorkerConfig, addr string) (*Worker, error) {
	sim, err := llm.NewSim(cfg.Sim)
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	sc := cfg.Server
	sc.Keys = cfg.Trust.Keys
	if sc.Ledger == nil {
		sc.Ledger = b.Ledger()
	}
	if sc.Watcher == nil {
		sc.Watcher = b.Watcher()
	}
	if sc.Writes == nil {
		sc.Writes = b.stores.Writes
	}
	if sc.ToolCache == nil {
		sc.ToolCache = b.stores.ToolCache
	}
	if sc.Models == nil {
		sc.Models = subagent.SimModels(sim)
		if cfg.ModelsFunc != nil {
			if sc.Models, err = cfg.ModelsFunc(b, sim); err != nil {
				_ = sim.Close()
				return nil, err
			}
		}
	}
	if sc.Name == "" {
		host, _ := os.Hostname()
		sc.Name = fmt.Sprintf("worker-%s-%d@%s", host, os.Getpid(), addr)
	}
	if sc.Logger == nil {
		sc.Logger = b.Logger().With("worker", sc.Name)
	}
	tools, err := openWorkerTools(ctx, b, cfg.MCP, sc.Name, sc.LeaseTTL, sc.Logger)
	if err != nil {
		_ = sim.Close()
		return nil, err
	}
	if sc.Tools == nil && sc.ToolsFunc == nil {
		sc.ToolsFunc = tools.registry
	}
	if sc.ToolAllowed == nil && cfg.MCP != nil {
		sc.ToolAllowed = toolAllowed(cfg.MCP.ToolPolicy())
	}
	sub, err := subagent.NewServer(sc)
	if err != nil {
		tools.close()
		_ = sim.Close()
		return nil, err
	}
	return &Worker{sub: sub, sim: sim, tools: tools, name: sc.Name}, nil
}

// Addr is the address the worker listens on (with the real port for ":0").
func (w *Worker) Addr() string { return w.srv.addr() }

// ProbeAddr is the address of the health probe port (WorkerConfig.ProbeListen), or "".
func (w *Worker) ProbeAddr() string { return w.srv.probeAddr }

// Name is the worker's name in the ledger and in run events.
func (w *Worker) Name() string { return w.name }

// Sim is the worker's sim model, whose calls tests read.
func (w *Worker) Sim() *llm.Sim { return w.sim }

// Close stops the worker: health NOT_SERVING, its subagents finish and
// settle (those still running when ctx ends are cancelled and settled),
// then the server stops. It returns the drain's error.
func (w *Worker) Close(ctx context.Context) error {
	err := w.srv.stop(ctx, w.sub.Shutdown)
	w.tools.close()
	return errors.Join(err, w.sim.Close())
}
