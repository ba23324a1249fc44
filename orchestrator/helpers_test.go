package orchestrator_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	fanoutnode "github.com/fanout/fanout/node"
	"github.com/fanout/fanout/orchestrator"
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
	if peerDir != "" {
		_ = os.RemoveAll(peerDir)
	}
	if err := goleak.Find(); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
		os.Exit(1)
	}
}

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// The peer trust every node of these tests holds: mutual TLS and signed
// dispatches, as in production, made once per test binary as `fanout dev`
// makes it.
var (
	peerOnce    sync.Once
	peerDir     string
	orchTrust   fanoutnode.OrchestratorTrust
	workerTrust fanoutnode.WorkerTrust
	peerErr     error
)

func trust(t testing.TB) (fanoutnode.OrchestratorTrust, fanoutnode.WorkerTrust) {
	t.Helper()
	peerOnce.Do(func() {
		if peerDir, peerErr = os.MkdirTemp("", "fanout-orchestrator-peer-"); peerErr == nil {
			orchTrust, workerTrust, _, peerErr = fanoutnode.DevTrust(peerDir)
		}
	})
	if peerErr != nil {
		t.Fatalf("peer trust: %v", peerErr)
	}
	return orchTrust, workerTrust
}

// testBundle is one test's database and the backend (pool, ledger, run
// store, exhaustion watcher, sweeper) shared by every node the test starts,
// as by the nodes of one `fanout dev` process.
type testBundle struct {
	url     string
	backend *fanoutnode.Backend
	pool    *store.Pool
	ledger  *store.Ledger
	// traced is set by the telemetry tests. Every node traces now (package
	// node installs the otelgrpc handlers on every server and client, as
	// cmd always did), so it changes nothing.
	traced bool
}

func setup(t testing.TB) *testBundle {
	t.Helper()
	url := storetest.NewDB(t)
	// Group commit on, as `fanout worker` and `fanout orchestrator` run by
	// default: the rules these tests prove go through the batch path a
	// real process takes (issue 41).
	b, err := fanoutnode.OpenBackend(t.Context(), fanoutnode.BackendConfig{DatabaseURL: url,
		PollInterval: 100 * time.Millisecond, Logger: quietLogger, GroupCommit: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return &testBundle{url: url, backend: b, pool: b.Pool(), ledger: b.Ledger()}
}

// dial connects a caller to an orchestrator (plaintext, as `--auth none` on loopback).
//
// The test orchestrators run with --auth none, where a caller is the tenant
// it names: every call names tenant t1 (the tenant of spec) unless its
// context names another (tenantCtx).
func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
			invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(withTenant(ctx, "t1"), method, req, reply, cc, opts...)
		}),
		grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
			streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(withTenant(ctx, "t1"), desc, cc, method, opts...)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// worker starts a subagent worker (package node: its own gRPC server with
// peer mTLS, a sim model) and returns its address and model.
func (b *testBundle) worker(t testing.TB, name string, sim llm.SimConfig, capacity int) (string, *llm.Sim) {
	t.Helper()
	_, wt := trust(t)
	w, err := fanoutnode.OpenWorker(t.Context(), b.backend, fanoutnode.WorkerConfig{Trust: wt, Sim: sim,
		Server: subagent.ServerConfig{Name: name, Capacity: capacity}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = w.Close(ctx)
	})
	return w.Addr(), w.Sim()
}

// node is one orchestrator replica.
type node struct {
	engine *orchestrator.Engine
	client fanoutv1.OrchestratorServiceClient
	addr   string
}

// orchestrator starts an orchestrator replica on the test's database that
// dispatches to workers (addresses), round-robin.
func (b *testBundle) orchestrator(t testing.TB, name string, cfg orchestrator.Config, workers ...string) *node {
	t.Helper()
	return b.orchestratorWith(t, name, cfg, nil, workers...)
}

// orchestratorWith is orchestrator with the engine's params changed by
// change (when not nil) before the engine is built.
func (b *testBundle) orchestratorWith(t testing.TB, name string, cfg orchestrator.Config,
	change func(*orchestrator.EngineParams), workers ...string) *node {
	t.Helper()
	if len(workers) == 0 { // validation-only tests: a worker nobody calls
		workers = []string{"127.0.0.1:1"}
	}
	cfg.Node = name
	ot, _ := trust(t)
	o, err := fanoutnode.OpenOrchestrator(t.Context(), b.backend, fanoutnode.OrchestratorConfig{
		Workers: strings.Join(workers, ","), Trust: ot, Engine: cfg, ParamsFunc: change,
		Auth: fanoutnode.CallerAuth{None: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := o.Close(ctx); err != nil {
			t.Errorf("shutdown %s: %v", name, err)
		}
	})
	return &node{engine: o.Engine(), client: fanoutv1.NewOrchestratorServiceClient(dial(t, o.Addr())), addr: o.Addr()}
}

// spec returns a valid spec of n independent tasks.
func spec(key string, n int, budgetTokens int64) *fanoutv1.RunSpec {
	s := &fanoutv1.RunSpec{
		IdempotencyKey: key,
		TenantId:       "t1",
		Goal:           "find facts",
		// Greedy: these tests are of the engine's other mechanisms
		// (dispatch, cancel, adoption, exhaustion in flight) and start their
		// tasks at once; with token budgets of the whole run's size, a
		// forecast would start them one at a time. Admission by forecast has
		// its own tests (budgetuse_test.go, forecast_test.go).
		Budget: &fanoutv1.Budget{LimitTokens: budgetTokens, Admission: fanoutv1.AdmissionPolicy_ADMISSION_POLICY_GREEDY},
		Model:  &fanoutv1.ModelSettings{Provider: "sim", MaxOutputTokens: 64},
	}
	for i := range n {
		s.Tasks = append(s.Tasks, &fanoutv1.TaskSpec{
			Id: fmt.Sprintf("t%02d", i), Instruction: fmt.Sprintf("look up item %d", i), TokenBudget: 100_000,
		})
	}
	return s
}

// watchAll streams a run's events until RunFinished.
func watchAll(t testing.TB, c fanoutv1.OrchestratorServiceClient, runID string) []*fanoutv1.RunEvent {
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
	// A task is queued once by each owner of the run (an adopter queues
	// again what it dispatches).
	queued := map[string]bool{}
	for _, ev := range evs {
		switch {
		case ev.GetRunAdopted() != nil:
			clear(queued)
		case ev.GetTaskQueued() != nil:
			id := ev.GetTaskQueued().GetTaskId()
			if queued[id] {
				t.Errorf("event %d queues task %s a second time", ev.GetSequence(), id)
			}
			queued[id] = true
		}
	}
	fin := evs[len(evs)-1].GetRunFinished()
	if fin == nil {
		t.Fatalf("last event is %T, want RunFinished", evs[len(evs)-1].GetEvent())
	}
	// One BudgetExhausted marks when the run's budget ran out: at most one
	// in any run, and one in every run that ended BUDGET_EXHAUSTED
	// (docs/budget.md, "When the budget ran out"). It precedes the
	// RunFinished, the last event.
	if marks := exhaustionMarks(evs); len(marks) > 1 ||
		fin.GetState() == fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED && len(marks) != 1 {
		t.Errorf("run ended %s with BudgetExhausted events at sequences %v; want at most one, and exactly one in a run that ended BUDGET_EXHAUSTED",
			fin.GetState(), marks)
	}
	return fin
}

// exhaustionMarks are the sequences of a run's BudgetExhausted events.
func exhaustionMarks(evs []*fanoutv1.RunEvent) []int64 {
	var marks []int64
	for _, ev := range evs {
		if ev.GetBudgetExhausted() != nil {
			marks = append(marks, ev.GetSequence())
		}
	}
	return marks
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

// withTenant names tenant in ctx's outgoing metadata unless it names one.
func withTenant(ctx context.Context, tenant string) context.Context {
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md.Get(orchestrator.TenantMetadataKey)) > 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, orchestrator.TenantMetadataKey, tenant)
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
