package node

import (
	"context"
	"fmt"
	"net"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

// defaultListen is where a node listens when its config names no address:
// a free port on loopback.
const defaultListen = "127.0.0.1:0"

// server is one gRPC server with health, reflection and the otelgrpc stats
// handler, listening on its own port.
type server struct {
	srv    *grpc.Server
	health *health.Server
	lis    net.Listener
	exited chan<- error  // gets Serve's error once it returns
	served chan struct{} // closed once Serve returned
}

// listen makes a server listening on addr (defaultListen if empty) whose
// Serve's error goes to exited, which must have room for it.
func listen(role, addr string, exited chan<- error, opts ...grpc.ServerOption) (*server, error) {
	if addr == "" {
		addr = defaultListen
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: listen on %s: %w", role, addr, err)
	}
	srv := grpc.NewServer(append(opts, grpc.StatsHandler(otelgrpc.NewServerHandler()))...)
	h := health.NewServer()
	healthpb.RegisterHealthServer(srv, h)
	reflection.Register(srv)
	return &server{srv: srv, health: h, lis: lis, exited: exited, served: make(chan struct{})}, nil
}

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
	return err
}

// close releases a server that never served.
func (s *server) close() { _ = s.lis.Close() }
