package node_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/node"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

func TestMain(m *testing.M) {
	storetest.MigrateFunc = store.Migrate
	// The peer keys, made once before any test: DevTrust makes them on
	// first use, and parallel tests would write them at once.
	if _, _, _, err := node.DevTrust(peerDir); err != nil {
		fmt.Fprintf(os.Stderr, "make the peer keys: %v\n", err)
		os.Exit(1)
	}
	storetest.Main(m)
	_ = os.RemoveAll(peerDir)
	if err := goleak.Find(); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
		os.Exit(1)
	}
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

var peerDir = func() string {
	d, err := os.MkdirTemp("", "fanout-node-peer-")
	if err != nil {
		panic(err)
	}
	return d
}()

func backend(t testing.TB, url string, cfg node.BackendConfig) *node.Backend {
	t.Helper()
	cfg.DatabaseURL, cfg.Logger = url, quiet
	b, err := node.OpenBackend(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// TestMaxStreamsPerProcess: with MaxStreams 3 (--max-streams 3), a fourth
// concurrent WatchRun is refused RESOURCE_EXHAUSTED naming the limit, health
// checks still answer, and a freed slot serves the next call.
func TestMaxStreamsPerProcess(t *testing.T) {
	t.Parallel()
	url := storetest.NewDB(t)
	_, workerTrust, _, err := node.DevTrust(peerDir)
	if err != nil {
		t.Fatal(err)
	}
	// The worker is another process: its calls do not count here.
	w, err := node.OpenWorker(t.Context(), backend(t, url, node.BackendConfig{}), node.WorkerConfig{Trust: workerTrust,
		Sim: llm.SimConfig{Latency: time.Minute}, Server: subagent.ServerConfig{Name: "w1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	o := startOrchestrator(t, backend(t, url, node.BackendConfig{MaxStreams: 3}),
		node.OrchestratorConfig{Workers: w.Addr(), Auth: node.CallerAuth{None: true}})
	conn, err := grpc.NewClient(o.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := fanoutv1.NewOrchestratorServiceClient(conn)
	started, err := client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: &fanoutv1.RunSpec{
		IdempotencyKey: "slow", Goal: "wait", Budget: &fanoutv1.Budget{LimitTokens: 10_000},
		Model: &fanoutv1.ModelSettings{Provider: "sim"},
		Tasks: []*fanoutv1.TaskSpec{{Id: "t1", Instruction: "take a minute", TokenBudget: 5_000}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { // end the minute-long run now, not at shutdown
		_, _ = client.CancelRun(context.WithoutCancel(t.Context()), &fanoutv1.CancelRunRequest{RunId: started.GetRunId()})
	}()
	watch := func(ctx context.Context) (*fanoutv1.WatchRunResponse, error) {
		s, err := client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: started.GetRunId()})
		if err != nil {
			return nil, err
		}
		return s.Recv() // the first event: the stream is being served
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for i := range 3 {
		if _, err := watch(ctx); err != nil {
			t.Fatalf("WatchRun %d of 3: %v", i+1, err)
		}
	}
	_, err = watch(t.Context())
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "at most 3 concurrent calls") ||
		!strings.Contains(err.Error(), "--max-streams") {
		t.Fatalf("4th WatchRun: %v, want RESOURCE_EXHAUSTED naming the limit of 3", err)
	}
	if _, err := client.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: started.GetRunId()}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("GetRun while full: %v, want RESOURCE_EXHAUSTED (unary calls count too)", err)
	}
	hc := healthpb.NewHealthClient(conn)
	if h, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health while full: %v, %v; want SERVING", h.GetStatus(), err)
	}
	// A freed slot serves the next call.
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := watch(t.Context())
		if err == nil {
			break
		}
		if status.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
			t.Fatalf("WatchRun after the others ended: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLedgerPoolIsSeparate: callers that hold every connection of the API's
// pool (slow readers) slow the run store, never a ledger Reserve.
func TestLedgerPoolIsSeparate(t *testing.T) {
	t.Parallel()
	b := backend(t, storetest.NewDB(t), node.BackendConfig{LedgerPool: 2, APIPool: 2})
	for range 2 {
		c, err := b.APIPool().Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
	}
	// Positive control: the run store is on the pool held.
	short, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if _, err := b.Runs().GetRun(short, "default", "r"); short.Err() == nil {
		t.Fatalf("GetRun with the API pool held: %v; want it to wait for a connection", err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	ra, err := b.Ledger().OpenRun(ctx, budget.OpenRunParams{RunID: "r", TenantID: "default", Limit: 1000,
		MinReservation: 1, Tasks: []budget.TaskBudget{{TaskID: "t", Limit: 1000}}})
	if err != nil {
		t.Fatalf("open run with the API pool held: %v", err)
	}
	attempt, err := b.Ledger().BeginAttempt(ctx, ra.Tasks["t"], "r", "default")
	if err != nil {
		t.Fatal(err)
	}
	r, err := b.Ledger().Reserve(ctx, budget.ReserveParams{Account: ra.Tasks["t"], RunID: "r", TenantID: "default",
		Attempt: attempt.N, Secret: attempt.Secret, Want: 100, Min: 1, Holder: "n", TTL: time.Minute})
	if err != nil || r.Amount != 100 {
		t.Fatalf("reserve with the API pool held: %+v, %v; want 100 granted at once", r, err)
	}
}
