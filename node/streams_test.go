package node_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/fanout/fanout/node"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent"
)

// TestStreamsPerConnection: "each connection may also hold at most 256
// streams (more wait in the client, as HTTP/2 does)" and "a worker: at
// least its --capacity" (docs/flags.md:56; operations.md:302). One process
// built as the server commands build it (node.Main): an orchestrator, a
// worker with the default capacity (64) and one with capacity 300. On one
// client connection to each, 256 (300) health Watch streams are admitted;
// the next one waits while they are open and is admitted once one of them
// closes. Health streams count against no other limit (--max-streams), so
// only the connection's bound is measured.
//
// Margins: admitting a stream takes about a millisecond here; the next
// stream is watched for 1 s (or 5 times the slowest admission, if longer)
// to show that it waits. Each admission has 20 s.
func TestStreamsPerConnection(t *testing.T) {
	t.Parallel()
	orchTrust, workerTrust, _, err := node.DevTrust(peerDir)
	if err != nil {
		t.Fatal(err)
	}
	m := node.NewMain(node.Config{
		Backend: node.BackendConfig{DatabaseURL: storetest.NewDB(t), Logger: quiet},
		Workers: []node.WorkerConfig{
			{Trust: workerTrust, Server: subagent.ServerConfig{Name: "default-capacity"}},
			{Trust: workerTrust, Server: subagent.ServerConfig{Name: "capacity-300", Capacity: 300}},
		},
		Orchestrator: &node.OrchestratorConfig{Trust: orchTrust, Auth: node.CallerAuth{None: true}},
	})
	if err := m.Open(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = m.Close(ctx)
	})
	peerCreds := grpc.WithTransportCredentials(credentials.NewTLS(orchTrust.TLS))
	for _, c := range []struct {
		name  string
		addr  string
		creds grpc.DialOption
		want  int
	}{
		{"orchestrator", m.Orchestrator().Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()), 256},
		{"worker with capacity 64", m.Workers()[0].Addr(), peerCreds, 256},
		{"worker with capacity 300", m.Workers()[1].Addr(), peerCreds, 300},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := grpc.NewClient(c.addr, c.creds)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = conn.Close() }()
			checkStreamsPerConn(t, healthpb.NewHealthClient(conn), c.want)
		})
	}
}

// checkStreamsPerConn opens n health Watch streams on hc's one connection,
// each admitted (its first status received), then shows that stream n+1
// waits until one of them closes.
func checkStreamsPerConn(t *testing.T, hc healthpb.HealthClient, n int) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel() // ends every stream, and a stream still waiting to open
	cancels := make([]context.CancelFunc, n)
	var slowest time.Duration
	for i := range n {
		sctx, scancel := context.WithCancel(ctx)
		cancels[i] = scancel
		start := time.Now()
		select {
		case err := <-watch(sctx, hc):
			if err != nil {
				t.Fatalf("stream %d of %d on one connection: %v", i+1, n, err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("stream %d of %d on one connection not admitted within 20 s", i+1, n)
		}
		slowest = max(slowest, time.Since(start))
	}
	window := max(time.Second, 5*slowest)
	t.Logf("%d streams admitted on one connection, the slowest in %v; watching stream %d for %v", n, slowest, n+1, window)

	next := watch(ctx, hc)
	select {
	case err := <-next:
		t.Fatalf("stream %d was admitted (err %v) while %d were open on its connection, want it to wait", n+1, err, n)
	case <-time.After(window):
	}
	cancels[0]()
	select {
	case err := <-next:
		if err != nil {
			t.Fatalf("stream %d after one of the %d closed: %v", n+1, n, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("stream %d not admitted within 20 s of one of the %d closing", n+1, n)
	}
}

// watch opens a health Watch stream that lives until ctx ends, and delivers
// nil once its first status arrives (the server admitted it). Opening waits
// in the client while the connection has no stream to spare.
func watch(ctx context.Context, hc healthpb.HealthClient) <-chan error {
	admitted := make(chan error, 1)
	go func() {
		s, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = s.Recv()
		}
		admitted <- err
	}()
	return admitted
}
