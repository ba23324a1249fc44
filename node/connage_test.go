package node_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"

	"github.com/fanout/fanout/node"
	"github.com/fanout/fanout/store/storetest"
)

// TestWorkerEndsOldConnections (issue 27): a worker asks an orchestrator's
// connection to reconnect once it is MaxConnectionAge old. A dns:///
// client resolves its target again only when a connection ends, so without
// this an orchestrator never uses a worker that joined the headless Service
// after it resolved (found by the Kubernetes node test: a scale-up, or a
// worker ready after the orchestrator, got no task). The connection must
// leave READY within the age plus its jitter, and not before the age.
func TestWorkerEndsOldConnections(t *testing.T) {
	t.Parallel()
	b := backend(t, storetest.NewDB(t), node.BackendConfig{})
	orchTrust, workerTrust, _, err := node.DevTrust(peerDir)
	if err != nil {
		t.Fatal(err)
	}
	const age = 2 * time.Second
	w, err := node.OpenWorker(t.Context(), b, node.WorkerConfig{Trust: workerTrust, MaxConnectionAge: age})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = w.Close(ctx)
	})
	conn, err := grpc.NewClient(w.Addr(), grpc.WithTransportCredentials(credentials.NewTLS(orchTrust.TLS)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			t.Fatalf("never READY: %s", s)
		}
	}
	ready := time.Now()
	if !conn.WaitForStateChange(ctx, connectivity.Ready) {
		t.Fatalf("the connection was still READY %s after it connected: the worker never ends it (max connection age %s)", time.Since(ready), age)
	}
	if d := time.Since(ready); d < age*8/10 || d > age*13/10+time.Second {
		t.Errorf("the connection left READY %s after it connected; want about %s (±10%% jitter)", d, age)
	}
}

// TestWorkerRefusesAShortConnectionAge: below 1s the worker does not start,
// and says which setting and why.
func TestWorkerRefusesAShortConnectionAge(t *testing.T) {
	t.Parallel()
	b := backend(t, storetest.NewDB(t), node.BackendConfig{})
	_, workerTrust, _, err := node.DevTrust(peerDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, age := range []time.Duration{-time.Second, 999 * time.Millisecond} {
		w, err := node.OpenWorker(t.Context(), b, node.WorkerConfig{Trust: workerTrust, MaxConnectionAge: age})
		if err == nil {
			_ = w.Close(t.Context())
			t.Fatalf("max connection age %s: started; want a refusal", age)
		}
		if want := "max connection age"; !strings.Contains(err.Error(), want) {
			t.Errorf("max connection age %s: %v; want an error naming %q", age, err, want)
		}
	}
}
