package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/fanout/fanout/internal/redact"
	"github.com/fanout/fanout/subagent"
)

// protocolVersion is the MCP version fanout asks for. 2025-11-25 is the
// latest with sessions: KeepAlive pings, one initialize per session and
// list_changed notifications on the session's stream. The SDK's newer
// stateless 2026-07-28 has no pings and no session to lose; a server that
// speaks only that cannot be used yet.
const protocolVersion = "2025-11-25"

// MetaIdempotencyKey is the _meta key of a call's idempotency key: a
// server that honours it returns the first result for a key it has seen
// instead of acting again.
const MetaIdempotencyKey = "fanout/idempotency-key"

// Defaults of Options.
const (
	DefaultSlotTTL   = 30 * time.Second
	DefaultSlotGrace = 10 * time.Second
	DefaultKeepAlive = 30 * time.Second
)

// Semaphore is the fleet-wide bound on calls in flight: *store.Semaphore
// behind an adapter (package subagent may not import store; docs/mcp.md
// has the adapter).
type Semaphore interface {
	// Acquire takes one slot of every key in want together, waiting until
	// it can or ctx ends (its error then wraps context.Cause(ctx)).
	Acquire(ctx context.Context, holder string, want []SlotRequest, ttl time.Duration) (Lease, error)
}

// SlotRequest asks for one slot of Key, whose bound is Limit.
type SlotRequest struct {
	Key   string
	Limit int
}

// Lease is a set of slots held together.
type Lease interface {
	// Hold runs fn while renewing the lease, and cancels fn's context
	// before a lease it could not renew ends.
	Hold(ctx context.Context, fn func(ctx context.Context) error) error
	// Release frees the slots after grace (0: now).
	Release(ctx context.Context, grace time.Duration) error
}

// RateLimiter is the fleet-wide rate bucket of each server with an rpm:
// *store.RateLimiter (or llm.MemoryLimiter for one process).
type RateLimiter interface {
	Define(ctx context.Context, bucket string, rpm, tpm int64, burst time.Duration) error
	Take(ctx context.Context, bucket string, requests, tokens int64) (wait time.Duration, err error)
}

// rateBurst is how much of a minute's rate a server's bucket holds, as
// for model providers (llm.ProviderConfig's Limits.Burst default): rpm
// 60 lets one call through a second, not 60 at once.
const rateBurst = time.Second

// Options configure a Manager.
type Options struct {
	Config *Config
	// Semaphore holds the max_in_flight slots; required if a server or a
	// tool has one.
	Semaphore Semaphore
	// RateLimiter holds the rpm buckets; required if a server has one.
	RateLimiter RateLimiter
	// Holder names this worker in the slots it holds. Default host-pid.
	Holder string
	// SlotTTL is the lease of a held slot, renewed while its call runs (a
	// dead worker's slots are free once it ends). Default DefaultSlotTTL.
	SlotTTL time.Duration
	// SlotGrace is how long the slots of a call cut off mid-flight stay
	// taken, since the server may still be running it. Default
	// DefaultSlotGrace.
	SlotGrace time.Duration
	// KeepAlive is the interval of the pings that find a dead session
	// before a call does. Default DefaultKeepAlive; negative disables.
	KeepAlive time.Duration
	Logger    *slog.Logger // default slog.Default()
	// MeterProvider and TracerProvider default to otel's globals.
	MeterProvider  metric.MeterProvider
	TracerProvider trace.TracerProvider

	// transport, if set, replaces the configured transports (tests connect
	// in-memory servers with it).
	transport func(ctx context.Context, s ServerConfig) (sdk.Transport, error)
}

// ErrClosed is the error of a call made after Manager.Close (it wraps
// subagent.ErrNotSent).
var ErrClosed = fmt.Errorf("%w: mcp manager closed", subagent.ErrNotSent)

// Manager holds one long-lived session per configured server and makes
// their tools subagent tools. It reconnects a session that ended (the
// server restarted, its process died, its HTTP session is gone) at the
// next call, and re-reads a server's tools when it says they changed. Safe
// for concurrent use.
type Manager struct {
	opts    Options
	log     *slog.Logger
	inst    instruments
	tracer  trace.Tracer
	servers []*server

	ctx    context.Context // ends at Close: connects and re-lists in flight stop
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup // every goroutine the manager starts
}

// Open connects to every configured server that has tools, lists its
// tools (every page), and checks that each configured tool is there and
// that no tool declared read is one its server marks destructive. It fails
// with every problem found, each naming its entry, and then holds no
// session. ctx bounds the whole of Open; each server's connect is also
// bounded by its connect_timeout.
func Open(ctx context.Context, opts Options) (*Manager, error) {
	if opts.Config == nil {
		return nil, errors.New("open mcp servers: Options.Config is nil")
	}
	if err := opts.check(); err != nil {
		return nil, fmt.Errorf("open mcp servers: %w", err)
	}
	opts.defaults()
	m := &Manager{
		opts:   opts,
		log:    opts.Logger,
		inst:   newInstruments(opts.MeterProvider),
		tracer: tracerOf(opts.TracerProvider),
	}
	m.ctx, m.cancel = context.WithCancel(context.WithoutCancel(ctx))
	for i, cfg := range opts.Config.Servers {
		if len(cfg.Tools) > 0 {
			m.servers = append(m.servers, newServer(m, i, cfg))
		}
	}
	if err := m.defineRates(ctx); err != nil {
		m.Close()
		return nil, fmt.Errorf("open mcp servers: %w", err)
	}
	errs := make([]error, len(m.servers))
	var g errgroup.Group
	for i, s := range m.servers {
		g.Go(func() error {
			errs[i] = s.secrets.err(s.start(ctx))
			return nil
		})
	}
	_ = g.Wait() // Every error is in errs.
	if err := errors.Join(errs...); err != nil {
		m.Close()
		return nil, fmt.Errorf("open mcp servers: %w", err)
	}
	for _, s := range m.servers {
		m.spawn(s.relistLoop)
	}
	return m, nil
}

// check says what a config needs that the options lack.
func (o *Options) check() error {
	var errs []error
	for i, s := range o.Config.Servers {
		path := fmt.Sprintf("servers[%d] (%s)", i, s.Name)
		if s.RPM > 0 && o.RateLimiter == nil {
			errs = append(errs, fmt.Errorf("%s.rpm: needs Options.RateLimiter (the fleet's rate buckets)", path))
		}
		if o.Semaphore != nil {
			continue
		}
		if s.MaxInFlight > 0 {
			errs = append(errs, fmt.Errorf("%s.max_in_flight: needs Options.Semaphore (the fleet's slots)", path))
		}
		for j, t := range s.Tools {
			if t.MaxInFlight > 0 {
				errs = append(errs, fmt.Errorf("%s.tools[%d] (%s).max_in_flight: needs Options.Semaphore (the fleet's slots)", path, j, t.Name))
			}
		}
	}
	return errors.Join(errs...)
}

func (o *Options) defaults() {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Holder == "" {
		host, _ := os.Hostname() // "" is a name too: the pid still tells workers apart on one host
		o.Holder = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if o.SlotTTL <= 0 {
		o.SlotTTL = DefaultSlotTTL
	}
	if o.SlotGrace <= 0 {
		o.SlotGrace = DefaultSlotGrace
	}
	switch {
	case o.KeepAlive == 0:
		o.KeepAlive = DefaultKeepAlive
	case o.KeepAlive < 0:
		o.KeepAlive = 0
	}
}

func (m *Manager) defineRates(ctx context.Context) error {
	for _, s := range m.servers {
		if s.cfg.RPM > 0 {
			if err := m.opts.RateLimiter.Define(ctx, s.bucket(), int64(s.cfg.RPM), 0, rateBurst); err != nil {
				return fmt.Errorf("%s.rpm: %w", s.path, err)
			}
		}
	}
	return nil
}

// spawn runs f in a goroutine the manager waits for at Close; after Close
// it runs nothing and reports false.
func (m *Manager) spawn(f func()) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		f()
	}()
	return true
}

// Close cuts off the calls in flight (the servers are sent
// notifications/cancelled; the calls fail, not as ErrNotSent), ends every
// session (a stdio server's process is asked to exit, then killed) and
// waits for the manager's goroutines. Later calls fail with ErrClosed.
func (m *Manager) Close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	m.mu.Unlock()
	m.cancel()
	var wg sync.WaitGroup
	for _, s := range m.servers {
		wg.Go(s.close)
	}
	wg.Wait()
	m.wg.Wait()
	for _, s := range m.servers {
		s.dialer.close()
	}
}

// Tools returns the subagent tools of every configured tool, in the
// config's order, with the definitions (description, input schema) and
// effects of the servers' latest tool lists.
func (m *Manager) Tools() []subagent.Tool {
	var tools []subagent.Tool
	for _, s := range m.servers {
		tools = append(tools, s.tools()...)
	}
	return tools
}

// server is one configured server and its session.
type server struct {
	m       *Manager
	path    string // "servers[1] (github)", for errors
	cfg     ServerConfig
	log     *slog.Logger
	dialer  *dialer
	secrets *secrets // redacted from its errors, results and logs
	client  *sdk.Client
	relist  chan struct{} // a list_changed notification came
	connect func(ctx context.Context) (sdk.Transport, error)

	mu      sync.Mutex
	sess    *session // nil when there is none
	dialing *dialing // the connect in flight
	known   map[string]*sdk.Tool
}

// session is one ClientSession of a server.
type session struct {
	cs    *sdk.ClientSession
	ended chan struct{} // closed when the connection ended
}

func (s *session) isEnded() bool {
	select {
	case <-s.ended:
		return true
	default:
		return false
	}
}

// dialing is a connect in flight, shared by the calls that wait for it.
type dialing struct {
	done chan struct{}
	sess *session
	err  error
}

func newServer(m *Manager, i int, cfg ServerConfig) *server {
	sec := &secrets{}
	// Its token first (an exact value), then the rule for every log.
	log := slog.New(redactingHandler{Handler: redact.NewHandler(m.log.Handler()), s: sec}).With("mcp_server", cfg.Name)
	s := &server{
		m:       m,
		path:    fmt.Sprintf("servers[%d] (%s)", i, cfg.Name),
		cfg:     cfg,
		log:     log,
		secrets: sec,
		dialer:  newDialer(cfg, log, sec),
		relist:  make(chan struct{}, 1),
		known:   map[string]*sdk.Tool{},
	}
	s.connect = s.dialer.transport
	if m.opts.transport != nil {
		s.connect = func(ctx context.Context) (sdk.Transport, error) { return m.opts.transport(ctx, cfg) }
	}
	s.client = newClient(log, m.opts.KeepAlive, func() {
		select {
		case s.relist <- struct{}{}:
		default: // A re-list is already due.
		}
	})
	return s
}

// newClient returns the SDK client of one server. onToolsChanged must
// not block: it runs on the session's reader.
func newClient(log *slog.Logger, keepAlive time.Duration, onToolsChanged func()) *sdk.Client {
	opts := &sdk.ClientOptions{
		Logger: log,
		// fanout offers the server nothing (no roots, sampling or
		// elicitation): it only calls tools.
		Capabilities: &sdk.ClientCapabilities{},
		KeepAlive:    keepAlive,
	}
	if onToolsChanged != nil {
		opts.ToolListChangedHandler = func(context.Context, *sdk.ToolListChangedRequest) { onToolsChanged() }
	}
	return sdk.NewClient(&sdk.Implementation{Name: "fanout", Version: version()}, opts)
}

func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "devel"
}

func (s *server) bucket() string { return "mcp:" + s.cfg.Name }

// start opens the first session and checks the configured tools against
// the server's list.
func (s *server) start(ctx context.Context) error {
	if _, err := s.session(ctx); err != nil {
		return fmt.Errorf("%s: %w", s.path, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs, missing []string
	for j, t := range s.cfg.Tools {
		def, ok := s.known[t.Name]
		if !ok {
			missing = append(missing, t.Name)
			continue
		}
		if _, err := effectOf(t.Effect, s.cfg.TrustAnnotations, def.Annotations); err != nil {
			errs = append(errs, fmt.Sprintf("%s.tools[%d] (%s).%s", s.path, j, t.Name, err))
		}
	}
	if len(missing) > 0 {
		have := make([]string, 0, len(s.known))
		for name := range s.known {
			have = append(have, name)
		}
		slices.Sort(have)
		errs = append(errs, fmt.Sprintf("%s: configured tools not on the server: %s (the server has: %s)",
			s.path, strings.Join(missing, ", "), strings.Join(have, ", ")))
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "\n"))
	}
	return nil
}

// session returns the server's live session, connecting if there is none.
// Concurrent callers share one connect, which a caller's ctx ending does
// not stop (others may be waiting for it).
func (s *server) session(ctx context.Context) (*session, error) {
	s.mu.Lock()
	if sess := s.sess; sess != nil && !sess.isEnded() {
		s.mu.Unlock()
		return sess, nil
	}
	d := s.dialing
	if d == nil {
		d = &dialing{done: make(chan struct{})}
		if !s.m.spawn(func() { s.dial(d) }) {
			s.mu.Unlock()
			return nil, ErrClosed
		}
		s.dialing = d
	}
	s.mu.Unlock()
	select {
	case <-d.done:
		return d.sess, d.err
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for a session: %w", context.Cause(ctx))
	}
}

// dial runs one connect for the callers waiting on d.
func (s *server) dial(d *dialing) {
	ctx, cancel := context.WithTimeout(s.m.ctx, s.cfg.ConnectTimeout)
	defer cancel()
	// A root span: a session serves the calls of many runs, none of them its parent.
	ctx, span := s.m.tracer.Start(ctx, "mcp.connect "+s.cfg.Name, trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrServer.String(s.cfg.Name), attrTransport.String(s.cfg.Transport)))
	sess, tools, err := s.open(ctx)
	outcome := "ok"
	if err != nil {
		outcome = "error"
		span.RecordError(err)
		span.SetStatus(otelcodes.Error, err.Error())
		s.log.WarnContext(ctx, "mcp connect failed", "endpoint", s.dialer.endpoint(), "err", err)
	}
	span.End()
	s.m.inst.connects.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(attrServer.String(s.cfg.Name), attrOutcome.String(outcome)))

	s.mu.Lock()
	s.dialing = nil
	if err == nil && s.m.ctx.Err() != nil {
		// Close ran while this connect was in flight, after it closed the
		// sessions it found: this one is closed here.
		_ = sess.cs.Close()
		sess, err = nil, ErrClosed
	}
	if err == nil {
		s.sess = sess
		s.learn(tools)
	}
	s.mu.Unlock()
	d.sess, d.err = sess, err
	close(d.done)
}

// open connects, lists the tools and starts the session's watcher.
func (s *server) open(ctx context.Context) (*session, []*sdk.Tool, error) {
	t, err := s.connect(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", s.dialer.endpoint(), err)
	}
	if !s.watchedHTTP() {
		t = probeWrites(t) // The evidence for neverSent.
	}
	cs, err := s.client.Connect(ctx, t, &sdk.ClientSessionOptions{ProtocolVersion: protocolVersion})
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", s.dialer.endpoint(), cutCause(ctx, err))
	}
	tools, err := listTools(ctx, cs)
	if err != nil {
		_ = cs.Close() // The session is of no use; the list's error says why.
		return nil, nil, fmt.Errorf("list the tools of %s: %w", s.dialer.endpoint(), cutCause(ctx, err))
	}
	sess := &session{cs: cs, ended: make(chan struct{})}
	if !s.m.spawn(func() { s.watch(sess) }) {
		_ = cs.Close()
		return nil, nil, ErrClosed
	}
	s.m.inst.sessions.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(attrServer.String(s.cfg.Name)))
	s.log.InfoContext(ctx, "mcp session open", "endpoint", s.dialer.endpoint(), "session_id", cs.ID(), "tools", len(tools))
	return sess, tools, nil
}

// cutCause returns ctx's cause if ctx ended (the SDK returns ctx.Err()).
func cutCause(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", context.Cause(ctx), err)
	}
	return err
}

// listTools reads every page of a server's tools.
func listTools(ctx context.Context, cs *sdk.ClientSession) ([]*sdk.Tool, error) {
	var tools []*sdk.Tool
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return nil, err
		}
		tools = append(tools, t)
	}
	return tools, nil
}

// learn records a tool list; s.mu is held. A tool that left the list keeps
// its last definition: its calls fail on the server, saying so.
func (s *server) learn(tools []*sdk.Tool) {
	for _, t := range tools {
		s.known[t.Name] = t
	}
}

// watch waits for a session's connection to end, for whatever reason (the
// server or its process went away, a keepalive ping failed, drop or Close
// closed it), and forgets it: the next call connects again.
func (s *server) watch(sess *session) {
	err := sess.cs.Wait()
	close(sess.ended)
	s.forget(sess)
	_ = sess.cs.Close() // Stops the pings and reaps a stdio process; the connection is already gone.
	s.m.inst.sessions.Add(context.WithoutCancel(s.m.ctx), -1, metric.WithAttributes(attrServer.String(s.cfg.Name)))
	if s.m.ctx.Err() == nil {
		s.log.Warn("mcp session ended; the next call reconnects", "endpoint", s.dialer.endpoint(), "err", err)
	}
}

func (s *server) forget(sess *session) {
	s.mu.Lock()
	if s.sess == sess {
		s.sess = nil
	}
	s.mu.Unlock()
}

// drop forgets a session a call found dead and closes it in the
// background (a stdio server's Close may wait for its process).
func (s *server) drop(sess *session) {
	s.forget(sess)
	s.m.spawn(func() { _ = sess.cs.Close() })
}

// close ends the session at Close.
func (s *server) close() {
	s.mu.Lock()
	sess := s.sess
	s.sess = nil
	s.mu.Unlock()
	if sess != nil {
		_ = sess.cs.Close() // Ending anyway: the watcher logs nothing once the manager is closed.
	}
}

// relistLoop re-reads the server's tools after each list_changed
// notification, until Close.
func (s *server) relistLoop() {
	for {
		select {
		case <-s.m.ctx.Done():
			return
		case <-s.relist:
		}
		s.relistOnce()
	}
}

func (s *server) relistOnce() {
	s.mu.Lock()
	sess := s.sess
	s.mu.Unlock()
	if sess == nil || sess.isEnded() {
		return // The next connect lists them.
	}
	ctx, cancel := context.WithTimeout(s.m.ctx, s.cfg.ConnectTimeout)
	defer cancel()
	tools, err := listTools(ctx, sess.cs)
	if err != nil {
		s.log.WarnContext(ctx, "mcp tool list changed, but re-reading it failed", "err", err)
		return
	}
	present := map[string]bool{}
	for _, t := range tools {
		present[t.Name] = true
	}
	s.mu.Lock()
	s.learn(tools)
	s.mu.Unlock()
	var gone []string
	for _, t := range s.cfg.Tools {
		if !present[t.Name] {
			gone = append(gone, t.Name)
		}
	}
	if len(gone) > 0 {
		s.log.WarnContext(ctx, "mcp tool list changed: configured tools are no longer on the server", "tools", gone)
	} else {
		s.log.InfoContext(ctx, "mcp tool list changed: re-read", "tools", len(tools))
	}
}

// tools returns the server's subagent tools.
func (s *server) tools() []subagent.Tool {
	s.mu.Lock()
	defer s.mu.Unlock()
	tools := make([]subagent.Tool, 0, len(s.cfg.Tools))
	for _, t := range s.cfg.Tools {
		def := s.known[t.Name]
		if def == nil {
			continue // Open checked every one; unreachable.
		}
		effect, err := effectOf(t.Effect, s.cfg.TrustAnnotations, def.Annotations)
		if err != nil {
			// The server changed its annotations after start: the write
			// is the safe reading until a human decides.
			s.log.Error("mcp tool declared read is now marked destructive by its server: treated as a write",
				"tool", t.Name)
		}
		timeout := t.CallTimeout
		if timeout == 0 {
			timeout = s.cfg.CallTimeout
		}
		tools = append(tools, subagent.Tool{
			Name:        ModelName(s.cfg.Name, t.Name),
			Description: description(s.cfg.Name, def),
			Effect:      effect,
			Schema:      schema(def),
			Server:      s.cfg.Name,
			Timeout:     timeout,
			CacheTTL:    cacheTTL(t, effect),
			Func:        s.toolFunc(t),
		})
	}
	return tools
}

// cacheTTL is the Tool.CacheTTL of configured tool t whose effect is
// effect now: none for a write (a server that marks a tool destructive
// after start makes it one), whatever the config says.
func cacheTTL(t ToolConfig, effect subagent.Effect) time.Duration {
	if effect != subagent.EffectRead {
		return 0
	}
	return t.CacheTTL
}

func description(server string, def *sdk.Tool) string {
	if d := strings.TrimSpace(def.Description); d != "" {
		return d
	}
	if def.Title != "" {
		return def.Title
	}
	return fmt.Sprintf("Tool %s of MCP server %s.", def.Name, server)
}

// schema returns a tool's input schema as the server sent it (the SDK
// decodes it into a map; it encodes back to the same JSON object).
func schema(def *sdk.Tool) json.RawMessage {
	if def.InputSchema == nil {
		return nil
	}
	b, err := json.Marshal(def.InputSchema)
	if err != nil {
		return nil // Decoded from JSON, it encodes; nil is "no declared properties".
	}
	return b
}

// spanAttrs are the attributes a call adds to the loop's execute_tool span.
func (s *server) spanAttrs(tool string) []attribute.KeyValue {
	return []attribute.KeyValue{attrServer.String(s.cfg.Name), attrTool.String(tool)}
}
