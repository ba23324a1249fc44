package node

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/fanout/fanout/admin"
	"github.com/fanout/fanout/auth"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/mcp"
)

// OrchestratorConfig configures an Orchestrator. Zero values take the
// documented defaults.
type OrchestratorConfig struct {
	// Listen is the gRPC address callers use (HOST:PORT). Default
	// 127.0.0.1:0, a free loopback port.
	Listen string
	// ProbeListen, if set, is where the health service is served alone, in
	// plaintext and without an API key, for the kubelet's gRPC probes.
	// Default: off.
	ProbeListen string
	// Workers is the workers' gRPC target: host:port,host:port (one client
	// each) or dns:///name:port (one round-robin client). Required, except
	// in a Main that serves workers itself: empty there means those.
	Workers string
	// Trust is the orchestrator's side of the peer trust: client TLS that
	// admits only workers, and the key that signs every dispatch. Required.
	Trust OrchestratorTrust
	// Engine tunes the engine (its defaults are orchestrator.Config's).
	// Unset KnownTools are the workers' built-in tools
	// (subagent.BuiltinToolNames) and MCPTools; an unset Logger is the
	// backend's.
	Engine orchestrator.Config
	// MCPTools are the model-facing names of the workers' MCP tools
	// (mcp.Config.ToolNames, read without connecting to any server), which
	// TaskSpec.allowed_tools may name too.
	MCPTools []string
	// ToolPolicy is the operator's policy of the tools (mcp.Config.ToolPolicy):
	// which tenants may name each in allowed_tools, and which writes wait
	// for approval. Unset Engine.ToolRules are made from it.
	ToolPolicy map[string]mcp.Policy
	// Auth authenticates the callers (API keys by default; see CallerAuth).
	Auth CallerAuth
	// HTTP configures the HTTP/JSON listener and the web console (off by
	// default).
	HTTP HTTPConfig
	// AdminDatabaseURL is the login AdminService acts as, a member of
	// fanout_admin and nothing else (--admin-database-url): the node's own
	// login may not call an admin function. Empty: AdminService answers
	// FAILED_PRECONDITION saying so.
	AdminDatabaseURL string
	// ParamsFunc, when set, changes the engine's collaborators before the
	// engine is built: a test wraps the store or the ledger with it.
	ParamsFunc func(*orchestrator.EngineParams)
}

// Orchestrator serves fanout.v1.OrchestratorService: it accepts runs,
// dispatches their tasks to workers, cancels and joins.
type Orchestrator struct {
	srv     *server
	engine  *orchestrator.Engine
	workers []*grpc.ClientConn
	// stopAuth stops the API keys' revocation watcher, which closes
	// authDone; nil with --auth none.
	stopAuth context.CancelFunc
	authDone chan struct{}
	// closeAdmin closes AdminService's pool.
	closeAdmin func()
	// http is the HTTP listener; nil when off.
	http *httpServer
}

// OpenOrchestrator starts an orchestrator on b, dialling its workers, and
// returns once it serves. Call Close to stop it.
func OpenOrchestrator(ctx context.Context, b *Backend, cfg OrchestratorConfig) (*Orchestrator, error) {
	return openOrchestrator(ctx, b, cfg, make(chan error, 1))
}

func openOrchestrator(ctx context.Context, b *Backend, cfg OrchestratorConfig, exited chan<- error) (_ *Orchestrator, err error) {
	if cfg.Trust.TLS == nil || cfg.Trust.Signer == nil {
		return nil, errors.New("orchestrator: peer TLS and a dispatch signing key are required")
	}
	if b.workersOnly {
		return nil, errors.New("orchestrator: the backend was opened WorkersOnly (it does not listen on run events)")
	}
	o := &Orchestrator{}
	defer func() {
		if err != nil {
			o.abandon()
		}
	}()
	if err := o.startEngine(b, cfg); err != nil {
		return nil, err
	}
	admin, err := openAdmin(cfg.AdminDatabaseURL, b)
	if err != nil {
		return nil, err
	}
	o.closeAdmin = admin.close
	// Authentication is an API read: its lookups (and the request buckets)
	// take the API pool, never the ledger's.
	authn := auth.NewAuthenticator(b.stores.Keys, auth.Config{Logger: b.Logger()})
	if err := o.listen(b, cfg, authn, admin, exited); err != nil {
		return nil, err
	}
	if !cfg.Auth.None {
		o.watchKeys(ctx, b, authn)
	}
	o.srv.serve(fanoutv1.OrchestratorService_ServiceDesc.ServiceName, fanoutv1.AdminService_ServiceDesc.ServiceName)
	if o.http != nil {
		o.http.serve(exited)
	}
	return o, nil
}

// abandon undoes what openOrchestrator had done when a later step failed:
// the engine (it never served: nothing to drain), the worker channels,
// AdminService's pool and the listeners.
func (o *Orchestrator) abandon() {
	if o.engine != nil {
		o.engine.Shutdown(context.Background()) //nolint:errcheck // the engine never served; nothing to drain
	}
	o.closeWorkers()
	if o.closeAdmin != nil {
		o.closeAdmin()
	}
	if o.srv != nil {
		o.srv.close()
	}
}

// startEngine dials the workers and builds the engine on b's stores.
func (o *Orchestrator) startEngine(b *Backend, cfg OrchestratorConfig) error {
	ws, err := o.dialWorkers(cfg.Workers, cfg.Trust.TLS)
	if err != nil {
		return err
	}
	pool, err := orchestrator.NewWorkerPool(ws...)
	if err != nil {
		return err
	}
	if cfg.Engine.KnownTools == nil {
		cfg.Engine.KnownTools = append(subagent.BuiltinToolNames(), cfg.MCPTools...)
	}
	if cfg.Engine.ReadTools == nil {
		cfg.Engine.ReadTools = builtinReadTools()
	}
	if cfg.Engine.Logger == nil {
		cfg.Engine.Logger = b.Logger()
	}
	if cfg.Engine.ToolRules == nil {
		cfg.Engine.ToolRules = toolRules(cfg.ToolPolicy)
	}
	params := orchestrator.EngineParams{
		Store:   b.Runs(),
		Ledger:  b.Ledger(),
		Watcher: b.Watcher(),
		Workers: pool,
		Signer:  cfg.Trust.Signer,
		Config:  cfg.Engine,
		Tenants: b.Runs(),
		Slots:   tenantTaskSlots{b.stores.Semaphore},
		Priors:  b.Runs(),
		// ForkRun's sources and the result cache: the run store's reads.
		Recorded: b.Runs(),
		// Decisions are API writes: the API pool, never the ledger's.
		Approvals: b.stores.Approvals,
		Spend:     b.stores.Spending,
		// WatchRun's followers hear other nodes' events on the process's
		// one LISTEN connection.
		Events: b.stores.Notifier,
		// Runs that leave their concurrency unset are sized from the
		// providers' stated limits (ledger pool, as the workers' limiter).
		RateLimits: rateLimits{store.NewProviderLimits(b.Pool())},
	}
	if cfg.ParamsFunc != nil {
		cfg.ParamsFunc(&params)
	}
	o.engine, err = orchestrator.NewEngine(params)
	return err
}

// listen opens the caller-facing listeners: gRPC (with the probe port, if
// asked) and HTTP, if asked, both behind one admission (the budgets of the
// calls read before they are authenticated) and the request-bytes gate.
// They serve once openOrchestrator says so.
func (o *Orchestrator) listen(b *Backend, cfg OrchestratorConfig, authn *auth.Authenticator, admin adminService,
	exited chan<- error) error {
	listenAddr := cmp.Or(cfg.Listen, defaultListen)
	recvLimit := 2*o.engine.Config().MaxSpecBytes + 1024 // orchestrator.ServerOptions' receive limit
	adm, err := b.admission(recvLimit)                   // the gRPC and HTTP listeners' budgets together
	if err != nil {
		return err
	}
	authOpts, err := cfg.Auth.serverOptions(listenAddr, authn, adm, b.Logger())
	if err != nil {
		return err
	}
	if o.srv, err = listen("orchestrator", listenAddr, b.streams, exited,
		append(append(orchestrator.ServerOptions(o.engine), callerWindows()...), authOpts...)...); err != nil {
		return err
	}
	if cfg.ProbeListen != "" {
		if _, err := o.srv.serveProbe(cfg.ProbeListen); err != nil {
			return err
		}
	}
	keys := authn
	if cfg.Auth.None {
		keys = nil
	}
	// Both services behind the request-bytes gate (gate.go), as the
	// generated Register functions would register them otherwise.
	g := &gate{bytes: adm.bytes, keys: keys, recvLimit: recvLimit, readTimeout: b.reqBytes.read}
	o.srv.srv.RegisterService(g.service(&fanoutv1.OrchestratorService_ServiceDesc), orchestrator.NewServer(o.engine))
	o.srv.srv.RegisterService(g.service(&fanoutv1.AdminService_ServiceDesc), admin.server)
	if cfg.HTTP.Listen != "" {
		o.http, err = listenHTTP(cfg.HTTP, cfg.Auth, o.srv.srv, keys, adm, recvLimit, b.reqBytes.read, b.httpLimits, b.Logger())
	}
	return err
}

// watchKeys reads the live keys' ids before the first call (after a
// restart, every tenant's key has a lookup lane a flood of made-up ids
// cannot fill) and starts the revocation watcher: a revoked or expired key
// stops within auth.MaxPollInterval here, and the streams open on it end.
func (o *Orchestrator) watchKeys(ctx context.Context, b *Backend, authn *auth.Authenticator) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if err := authn.LoadKnownIDs(lctx); err != nil {
		b.Logger().Warn("read the live key ids; the watcher reads them again", "err", err)
	}
	cancel()
	wctx, stop := context.WithCancel(context.Background())
	o.stopAuth, o.authDone = stop, make(chan struct{})
	go func() {
		defer close(o.authDone)
		if err := authn.Run(wctx); err != nil {
			b.Logger().Error("API key revocation watcher stopped", "err", err)
		}
	}()
}

// workerBackoff is the reconnect backoff of the worker channels: capped at
// 2s (plus its jitter), below the dispatcher's per-try connect wait, so that
// every wait sees the channel try again.
var workerBackoff = backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2,
	MaxDelay: 2 * time.Second}

// dialWorkers makes one client per address of a static list, or one
// round-robin client for a dns:/// target.
func (o *Orchestrator) dialWorkers(target string, tlsCfg *tls.Config) ([]orchestrator.Worker, error) {
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"round_robin":{}}]}`),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler()), // carries the run's trace to the worker
		// Dispatch waits for a worker (wait-for-ready) while a worker
		// restarts or has not come up yet: the channel must find it soon
		// after it listens. gRPC's default backoff grows to 2 minutes.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: workerBackoff, MinConnectTimeout: 5 * time.Second}),
		// A channel stays connected: an idle one would count as not
		// connected, and dispatch would pass it over (WorkerPool.Connected).
		grpc.WithIdleTimeout(0),
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
		return nil, errors.New("workers: need a gRPC target (host:port,host:port or dns:///name:port)")
	}
	var ws []orchestrator.Worker
	for _, a := range addrs {
		conn, err := grpc.NewClient(a, opts...)
		if err != nil {
			o.closeWorkers()
			return nil, fmt.Errorf("workers %q: %w", a, err)
		}
		conn.Connect() // dial now, not on the first task
		o.workers = append(o.workers, conn)
		ws = append(ws, orchestrator.Worker{Addr: a, Client: fanoutv1.NewSubagentServiceClient(conn), Conn: conn})
	}
	return ws, nil
}

func (o *Orchestrator) closeWorkers() {
	for _, c := range o.workers {
		_ = c.Close()
	}
	o.workers = nil
}

// Addr is the address the orchestrator listens on (with the real port for ":0").
func (o *Orchestrator) Addr() string { return o.srv.addr() }

// HTTPAddr is the address the HTTP listener listens on; "" when it is off.
func (o *Orchestrator) HTTPAddr() string {
	if o.http == nil {
		return ""
	}
	return o.http.addr()
}

// ProbeAddr is the address of the health probe port (OrchestratorConfig.ProbeListen), or "".
func (o *Orchestrator) ProbeAddr() string { return o.srv.probeAddr }

// Engine is the orchestrator's engine.
func (o *Orchestrator) Engine() *orchestrator.Engine { return o.engine }

// Close stops the orchestrator: health NOT_SERVING, the runs it drives end
// (those still running when ctx ends are cancelled), then the server stops
// and the worker connections close. It returns the engine's shutdown error.
func (o *Orchestrator) Close(ctx context.Context) error {
	var httpStopped chan struct{}
	err := o.srv.stop(ctx, func(ctx context.Context) error {
		defer o.closeWorkers()
		err := o.engine.Shutdown(ctx)
		if o.http != nil {
			// No new HTTP calls from now; the gRPC server's stop ends those
			// in flight (it drains ServeHTTP's transports with its own).
			httpStopped = make(chan struct{})
			go func() { defer close(httpStopped); o.http.stop(ctx) }()
		}
		return err
	})
	if httpStopped != nil {
		<-httpStopped
	}
	if o.stopAuth != nil {
		o.stopAuth()
		<-o.authDone
	}
	o.closeAdmin()
	return err
}

// adminService is AdminService as an orchestrator serves it, and how to
// close what it opened.
type adminService struct {
	server fanoutv1.AdminServiceServer
	close  func()
}

// openAdmin serves AdminService on its own login (url, a member of
// fanout_admin), or, with none, answers that it is off.
func openAdmin(url string, b *Backend) (adminService, error) {
	if url == "" {
		return adminService{server: adminOff{}, close: func() {}}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := store.OpenAdmin(ctx, url)
	if err != nil {
		return adminService{}, fmt.Errorf("orchestrator: --admin-database-url: %w", err)
	}
	return adminService{server: admin.NewServer(st.Keys, st.Ledger, b.Logger()), close: st.Close}, nil
}

// errAdminOff is every AdminService answer of an orchestrator started
// without an admin login.
var errAdminOff = status.Error(codes.FailedPrecondition,
	"AdminService is off on this orchestrator: start it with --admin-database-url, a login that is a member of fanout_admin (docs/operations.md \"Database roles\")")

// adminOff is AdminService with no admin login: every call is refused.
type adminOff struct {
	fanoutv1.UnimplementedAdminServiceServer
}

func (adminOff) CreateTenant(context.Context, *fanoutv1.CreateTenantRequest) (*fanoutv1.CreateTenantResponse, error) {
	return nil, errAdminOff
}

func (adminOff) UpdateTenant(context.Context, *fanoutv1.UpdateTenantRequest) (*fanoutv1.UpdateTenantResponse, error) {
	return nil, errAdminOff
}

func (adminOff) GetTenant(context.Context, *fanoutv1.GetTenantRequest) (*fanoutv1.GetTenantResponse, error) {
	return nil, errAdminOff
}

func (adminOff) CreateKey(context.Context, *fanoutv1.CreateKeyRequest) (*fanoutv1.CreateKeyResponse, error) {
	return nil, errAdminOff
}

func (adminOff) ListKeys(context.Context, *fanoutv1.ListKeysRequest) (*fanoutv1.ListKeysResponse, error) {
	return nil, errAdminOff
}

func (adminOff) RevokeKey(context.Context, *fanoutv1.RevokeKeyRequest) (*fanoutv1.RevokeKeyResponse, error) {
	return nil, errAdminOff
}

// taskSlotTTL is the lease of a tenant's task slot: renewed every third of
// it while the task runs, freed by itself that long after its holder died.
const taskSlotTTL = 30 * time.Second

// tenantTaskSlots is *store.Semaphore as the engine's orchestrator.TaskSlots.
type tenantTaskSlots struct{ s *store.Semaphore }

var _ orchestrator.TaskSlots = tenantTaskSlots{}

func (t tenantTaskSlots) Hold(ctx context.Context, holder, key string, limit int, fn func(context.Context) error) error {
	lease, err := t.s.Acquire(ctx, holder, []store.SlotRequest{{Key: key, Limit: limit}}, taskSlotTTL)
	if err != nil {
		return err
	}
	defer t.s.Release(context.WithoutCancel(ctx), lease, 0) //nolint:errcheck // logged by Release; the slot frees itself at its lease's end
	return t.s.Hold(ctx, &lease, fn)
}

// builtinReadTools are the workers' built-in tools that only read: those a
// hedged task may allow (orchestrator.Config.ReadTools).
func builtinReadTools() []string {
	tools := subagent.BuiltinTools()
	var read []string
	for _, name := range subagent.BuiltinToolNames() {
		if t, ok := tools.Get(name); ok && t.Effect == subagent.EffectRead {
			read = append(read, name)
		}
	}
	return read
}
