package orchestrator_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/orchestrator"
	"github.com/fanout/fanout/peer"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// patience bounds every wait in these tests that must end by itself: one
// that has not ended by then fails, saying what did not happen, instead of
// hanging until the package timeout. It is generous (the machine may be
// busy); the tests' claims are orderings, not speeds.
const patience = 30 * time.Second

// await waits until ch delivers or is closed, or reports what did not
// happen within patience. It reports with t.Errorf, so cleanups can use it.
func await[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	timer := time.NewTimer(patience)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		t.Errorf("%s: not within %v", what, patience)
	}
}

func TestMain(m *testing.M) {
	storetest.MigrateFunc = store.Migrate
	storetest.Main(m)
	if err := goleak.Find(); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
		os.Exit(1)
	}
}

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// testBundle is one test's database, shared by every node the test starts.
type testBundle struct {
	url    string
	pool   *pgxpool.Pool
	ledger *store.Ledger
	// traced installs the otelgrpc stats handlers on every server and
	// client the test starts, as cmd does.
	traced bool
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	url := storetest.NewDB(t)
	pool, err := store.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &testBundle{url: url, pool: pool, ledger: store.NewLedger(pool)}
}

// watcher starts a budget watcher for one node, stopped at cleanup.
func (b *testBundle) watcher(t *testing.T) *budget.Watcher {
	t.Helper()
	w := budget.NewWatcher(store.NewWatchSource(b.pool, b.url), budget.WatcherConfig{
		PollInterval: 100 * time.Millisecond, Logger: quietLogger})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = w.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		await(t, stopped, "a budget watcher stopping")
	})
	return w
}

// serve starts a gRPC server on a loopback port, stopped at cleanup.
func serve(t *testing.T, register func(*grpc.Server), opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	register(srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		await(t, done, "a gRPC server stopping")
	})
	return lis.Addr().String()
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// worker starts a real subagent worker process-equivalent (its own gRPC
// server, watcher and sim model) and returns its address and model.
func (b *testBundle) worker(t *testing.T, name string, sim llm.SimConfig, capacity int) (string, *llm.Sim) {
	t.Helper()
	model, err := llm.NewSim(sim)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := subagent.NewServer(subagent.ServerConfig{
		Ledger: b.ledger, Keys: testKeys, Watcher: b.watcher(t), Models: subagent.SimModels(model),
		Name: name, Capacity: capacity, Logger: quietLogger,
	})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, func(s *grpc.Server) { fanoutv1.RegisterSubagentServiceServer(s, srv) }, b.serverOpts()...)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return addr, model
}

// testSigner signs the test orchestrators' dispatches; testKeys is what the
// test workers trust.
var (
	testSigner = peer.NewSigner(ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)))
	testKeys   = peer.NewKeySet(testSigner.Public())
)

// node is one orchestrator replica.
type node struct {
	engine *orchestrator.Engine
	server *orchestrator.Server
	client fanoutv1.OrchestratorServiceClient
}

// orchestrator starts an orchestrator replica on the test's database that
// dispatches to workers (addresses), round-robin.
func (b *testBundle) orchestrator(t *testing.T, name string, cfg orchestrator.Config, workers ...string) *node {
	t.Helper()
	return b.orchestratorWith(t, name, cfg, nil, workers...)
}

// orchestratorWith is orchestrator with the engine's params changed by
// change (when not nil) before the engine is built.
func (b *testBundle) orchestratorWith(t *testing.T, name string, cfg orchestrator.Config,
	change func(*orchestrator.EngineParams), workers ...string) *node {
	t.Helper()
	var ws []orchestrator.Worker
	for _, addr := range workers {
		ws = append(ws, orchestrator.Worker{Addr: addr, Client: fanoutv1.NewSubagentServiceClient(dial(t, addr, b.dialOpts()...))})
	}
	if len(ws) == 0 { // validation-only tests: a worker nobody calls
		ws = append(ws, orchestrator.Worker{Addr: "none", Client: fanoutv1.NewSubagentServiceClient(dial(t, "127.0.0.1:1"))})
	}
	pool, err := orchestrator.NewWorkerPool(ws...)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Node = name
	if cfg.Logger == nil {
		cfg.Logger = quietLogger
	}
	if cfg.KnownTools == nil {
		cfg.KnownTools = subagent.BuiltinToolNames()
	}
	params := orchestrator.EngineParams{
		Store: store.NewRuns(b.pool), Ledger: b.ledger, Watcher: b.watcher(t), Workers: pool, Signer: testSigner, Config: cfg,
	}
	if change != nil {
		change(&params)
	}
	e, err := orchestrator.NewEngine(params)
	if err != nil {
		t.Fatal(err)
	}
	srv := orchestrator.NewServer(e)
	addr := serve(t, func(s *grpc.Server) { fanoutv1.RegisterOrchestratorServiceServer(s, srv) },
		append(orchestrator.ServerOptions(e), b.serverOpts()...)...)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown %s: %v", name, err)
		}
	})
	return &node{engine: e, server: srv, client: fanoutv1.NewOrchestratorServiceClient(dial(t, addr))}
}

func (b *testBundle) serverOpts() []grpc.ServerOption {
	if !b.traced {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler())}
}

func (b *testBundle) dialOpts() []grpc.DialOption {
	if !b.traced {
		return nil
	}
	return []grpc.DialOption{grpc.WithStatsHandler(otelgrpc.NewClientHandler())}
}

// spec returns a valid spec of n independent tasks.
func spec(key string, n int, budgetTokens int64) *fanoutv1.RunSpec {
	s := &fanoutv1.RunSpec{
		IdempotencyKey: key,
		TenantId:       "t1",
		Goal:           "find facts",
		Budget:         &fanoutv1.Budget{LimitTokens: budgetTokens},
		Model:          &fanoutv1.ModelSettings{Provider: "sim", MaxOutputTokens: 64},
	}
	for i := range n {
		s.Tasks = append(s.Tasks, &fanoutv1.TaskSpec{
			Id: fmt.Sprintf("t%02d", i), Instruction: fmt.Sprintf("look up item %d", i), TokenBudget: 100_000,
		})
	}
	return s
}

// watchAll streams a run's events until RunFinished.
func watchAll(t *testing.T, c fanoutv1.OrchestratorServiceClient, runID string) []*fanoutv1.RunEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	stream, err := c.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	var evs []*fanoutv1.RunEvent
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return evs
		}
		if err != nil {
			t.Fatalf("watch run %s: %v (after %d events)", runID, err, len(evs))
		}
		evs = append(evs, msg.GetEvent())
	}
}

// checkEvents checks the invariants of a finished run's history and returns
// its RunFinished.
func checkEvents(t *testing.T, evs []*fanoutv1.RunEvent) *fanoutv1.RunFinished {
	t.Helper()
	if len(evs) < 2 {
		t.Fatalf("got %d events, want at least RunStarted and RunFinished", len(evs))
	}
	for i, ev := range evs {
		if ev.GetSequence() != int64(i+1) {
			t.Fatalf("event %d has sequence %d", i, ev.GetSequence())
		}
	}
	if evs[0].GetRunStarted() == nil {
		t.Errorf("first event is %T, want RunStarted", evs[0].GetEvent())
	}
	fin := evs[len(evs)-1].GetRunFinished()
	if fin == nil {
		t.Fatalf("last event is %T, want RunFinished", evs[len(evs)-1].GetEvent())
	}
	return fin
}

// checkLedger checks conservation on every account and that nothing is
// held. The view must report on every account: one it does not list is not
// shown conserved, and a view that lists none shows nothing.
func (b *testBundle) checkLedger(t *testing.T) {
	t.Helper()
	var listed, accounts, held int64
	var bad []int64
	if err := b.pool.QueryRow(t.Context(), `SELECT
		(SELECT count(*) FROM conservation_check),
		(SELECT count(*) FROM account),
		(SELECT coalesce(array_agg(account_id ORDER BY account_id), '{}') FROM conservation_check WHERE NOT conserved)`).
		Scan(&listed, &accounts, &bad); err != nil {
		t.Fatal(err)
	}
	if listed == 0 || listed != accounts {
		t.Errorf("conservation_check lists %d accounts of %d: want every account, and at least one", listed, accounts)
	}
	if len(bad) != 0 {
		t.Errorf("conservation_check: accounts %v are not conserved", bad)
	}
	if err := b.pool.QueryRow(t.Context(), `SELECT count(*) FROM reservation WHERE state = 'held'`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Errorf("%d reservations still held after the run closed", held)
	}
}

// checkRunJournal checks I1 on the journal itself, not through the account
// row (whose CHECK makes an overspent row impossible to see): replaying the
// entries whose chain holds the run account in entry_id order, no prefix
// has more reserved and spent than the limit. Every entry that changes the
// run is written under the run row's lock, so entry_id order is the order
// those changes committed in.
func (b *testBundle) checkRunJournal(t *testing.T, runID string) {
	t.Helper()
	const journal = `WITH run AS (SELECT account_id FROM account WHERE run_id = $1 AND kind = 'run'),
		j AS (SELECT e.entry_id, e.kind,
		             (sum(e.delta_limit) OVER w)::bigint AS lim,
		             (sum(e.delta_reserved) OVER w)::bigint AS reserved,
		             (sum(e.delta_spent) OVER w)::bigint AS spent
		        FROM ledger_entry e JOIN run ON run.account_id = ANY (e.chain)
		      WINDOW w AS (ORDER BY e.entry_id))`
	var entries, reserves, firstBad int64
	if err := b.pool.QueryRow(t.Context(), journal+`
		SELECT count(*), count(*) FILTER (WHERE kind = 'reserve'),
		       coalesce(min(entry_id) FILTER (WHERE reserved + spent > lim OR reserved < 0 OR spent < 0), 0)
		  FROM j`, runID).Scan(&entries, &reserves, &firstBad); err != nil {
		t.Fatal(err)
	}
	if reserves == 0 {
		t.Fatalf("run %s: the journal has %d entries on the run account and no reservation: nothing to check", runID, entries)
	}
	if firstBad != 0 {
		var lim, reserved, spent int64
		if err := b.pool.QueryRow(t.Context(), journal+`SELECT lim, reserved, spent FROM j WHERE entry_id = $2`,
			runID, firstBad).Scan(&lim, &reserved, &spent); err != nil {
			t.Fatal(err)
		}
		t.Errorf("run %s: after journal entry %d the run had %d reserved + %d spent = %d of its %d limit",
			runID, firstBad, reserved, spent, reserved+spent, lim)
	}
}

func terminal(s fanoutv1.TaskStatus) bool {
	return s != fanoutv1.TaskStatus_TASK_STATUS_UNSPECIFIED && s != fanoutv1.TaskStatus_TASK_STATUS_PENDING &&
		s != fanoutv1.TaskStatus_TASK_STATUS_RUNNING
}

func tenantCtx(t *testing.T, tenant string) context.Context {
	return metadata.AppendToOutgoingContext(t.Context(), orchestrator.TenantMetadataKey, tenant)
}

// watchAllAfter streams a run's events after a sequence until RunFinished.
func watchAllAfter(t *testing.T, c fanoutv1.OrchestratorServiceClient, runID string, after int64) []*fanoutv1.RunEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	stream, err := c.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID, AfterSequence: after})
	if err != nil {
		t.Fatal(err)
	}
	var evs []*fanoutv1.RunEvent
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return evs
		}
		if err != nil {
			t.Fatalf("watch run %s: %v", runID, err)
		}
		evs = append(evs, msg.GetEvent())
	}
}
