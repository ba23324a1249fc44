package node

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
)

// defaultListen is where a node listens when its config names no address:
// a free port on loopback.
const defaultListen = "127.0.0.1:0"

const (
	// DefaultMaxStreams is the most calls one process serves at once, across
	// its servers and connections, when BackendConfig sets none.
	DefaultMaxStreams = 10_000
	// StreamsPerConn is the most concurrent streams (calls) one client
	// connection may hold on a server; more wait in the client, as HTTP/2's
	// SETTINGS_MAX_CONCURRENT_STREAMS makes them.
	StreamsPerConn = 256
)

// keepalive: the server pings a connection idle for keepaliveTime and drops
// it when no answer comes within keepaliveTimeout (a caller that vanished
// without a FIN); a client pinging more often than every keepaliveMinTime
// is sent GOAWAY (ENHANCE_YOUR_CALM). Clients may ping with no call open.
const (
	keepaliveTime    = time.Minute
	keepaliveTimeout = 20 * time.Second
	keepaliveMinTime = 10 * time.Second
)

// streamLimit caps the calls in flight across every server of one process:
// a call past the cap is refused RESOURCE_EXHAUSTED before any work.
// Health checks never count and are never refused: a full process is busy,
// not dead, and a probe that failed would have it restarted.
type streamLimit struct {
	max int64
	n   atomic.Int64
	// keepalive is when the servers ping an idle connection and drop it:
	// keepaliveTime and keepaliveTimeout, which only tests shorten.
	keepalive keepalive.ServerParameters
}

func newStreamLimit(n int) *streamLimit {
	return &streamLimit{max: int64(n), keepalive: keepalive.ServerParameters{Time: keepaliveTime, Timeout: keepaliveTimeout}}
}

// counts reports whether a call of method counts against the cap.
func counts(method string) bool {
	return !strings.HasPrefix(method, "/"+healthpb.Health_ServiceDesc.ServiceName+"/")
}

// acquire takes a slot for a call of method; release gives it back. It
// returns the RESOURCE_EXHAUSTED status when the process is full.
func (l *streamLimit) acquire(method string) (release func(), err error) {
	if !counts(method) {
		return func() {}, nil
	}
	if l.n.Add(1) > l.max {
		l.n.Add(-1)
		st, derr := status.New(codes.ResourceExhausted, fmt.Sprintf(
			"this process serves at most %d concurrent calls (--max-streams); retry later or on another replica", l.max)).
			WithDetails(&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
				Subject: "max-streams", Description: fmt.Sprintf("at most %d concurrent calls per process", l.max)}}})
		if derr != nil {
			return nil, status.Errorf(codes.ResourceExhausted, "this process serves at most %d concurrent calls (--max-streams)", l.max)
		}
		return nil, st.Err()
	}
	return func() { l.n.Add(-1) }, nil
}

func (l *streamLimit) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	release, err := l.acquire(info.FullMethod)
	if err != nil {
		return nil, err
	}
	defer release()
	return handler(ctx, req)
}

func (l *streamLimit) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	release, err := l.acquire(info.FullMethod)
	if err != nil {
		return err
	}
	defer release()
	return handler(srv, ss)
}

// options are the server options that hold a server to the API's limits:
// the process-wide cap, StreamsPerConn and keepalive enforcement.
func (l *streamLimit) options() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(StreamsPerConn),
		grpc.ChainUnaryInterceptor(l.unary),
		grpc.ChainStreamInterceptor(l.stream),
		grpc.KeepaliveParams(l.keepalive),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime, PermitWithoutStream: true}),
	}
}

// server is one gRPC server with health, reflection and the otelgrpc stats
// handler, listening on its own port.
type server struct {
	srv    *grpc.Server
	health *health.Server
	lis    net.Listener
	// probe, if not nil, serves health alone in plaintext (serveProbe) on probeAddr.
	probe     *grpc.Server
	probeAddr string
	exited    chan<- error  // gets Serve's error once it returns
	served    chan struct{} // closed once Serve returned
}

// listen makes a server listening on addr (defaultListen if empty), held to
// limit (opts may override its options), whose Serve's error goes to
// exited, which must have room for it.
func listen(role, addr string, limit *streamLimit, exited chan<- error, opts ...grpc.ServerOption) (*server, error) {
	if addr == "" {
		addr = defaultListen
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: listen on %s: %w", role, addr, err)
	}
	opts = append(limit.options(), append(opts, grpc.StatsHandler(otelgrpc.NewServerHandler()))...)
	srv := grpc.NewServer(opts...)
	h := health.NewServer()
	healthpb.RegisterHealthServer(srv, h)
	reflection.Register(srv)
	return &server{srv: srv, health: h, lis: lis, exited: exited, served: make(chan struct{})}, nil
}

// serveProbe serves the health service alone, in plaintext, on addr: the
// kubelet's gRPC probes speak neither TLS nor API keys, and a worker's own
// port admits only orchestrators. It answers as the server does: SERVING
// once it serves, NOT_SERVING from the moment it drains (stop). Nothing
// else is served there. It returns the address it listens on.
func (s *server) serveProbe(addr string) (string, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("health probe: listen on %s: %w", addr, err)
	}
	s.probe = grpc.NewServer(grpc.MaxConcurrentStreams(probeStreams), grpc.MaxRecvMsgSize(probeRecvBytes))
	healthpb.RegisterHealthServer(s.probe, s.health)
	go func() { _ = s.probe.Serve(lis) }()
	s.probeAddr = lis.Addr().String()
	return s.probeAddr, nil
}

// The probe port's bounds: a health check is one small request.
const (
	probeStreams   = 16
	probeRecvBytes = 4 << 10
)

// addr is the address the server listens on (with the real port for ":0").
func (s *server) addr() string { return s.lis.Addr().String() }

// serve marks the server and its services SERVING and serves in a goroutine.
func (s *server) serve(services ...string) {
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	for _, name := range services {
		s.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	go func() {
		defer close(s.served)
		s.exited <- s.srv.Serve(s.lis)
	}()
}

// stop shuts the server down gracefully: health NOT_SERVING, drain (the
// service's own work, bounded by ctx), GracefulStop, and Stop if ctx ends
// first. It returns drain's error once Serve has returned.
func (s *server) stop(ctx context.Context, drain func(context.Context) error) error {
	s.health.Shutdown()
	var err error
	if drain != nil {
		err = drain(ctx)
	}
	stopped := make(chan struct{})
	go func() { s.srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		s.srv.Stop()
		<-stopped
	}
	<-s.served
	if s.probe != nil {
		s.probe.Stop()
	}
	return err
}

// close releases a server that never served.
func (s *server) close() {
	_ = s.lis.Close()
	if s.probe != nil {
		s.probe.Stop()
	}
}
