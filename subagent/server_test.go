package subagent_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/peer"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// serve runs srv over bufconn and returns a client.
func serve(t *testing.T, srv *subagent.Server) fanoutv1.SubagentServiceClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	fanoutv1.RegisterSubagentServiceServer(gs, srv)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(lis)
	}()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		gs.Stop()
		select {
		case <-served:
		case <-time.After(patience):
			t.Errorf("the gRPC server did not stop within %v", patience)
		}
	})
	return fanoutv1.NewSubagentServiceClient(conn)
}

func newServer(t *testing.T, b *bundle, m llm.Model, mod func(*subagent.ServerConfig)) *subagent.Server {
	t.Helper()
	cfg := subagent.ServerConfig{Ledger: b.ledger, Keys: testKeys, Models: subagent.SimModels(m), Name: "w1",
		Writes: store.NewToolCalls(b.pool, store.ToolCallsConfig{})}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := subagent.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// testSigner signs dispatches as an orchestrator would; testKeys is what
// the test workers trust.
var (
	testSigner = peer.NewSigner(ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)))
	testKeys   = peer.NewKeySet(testSigner.Public())
)

// signed wraps d in an envelope signed by testSigner.
func signed(d *fanoutv1.Dispatch) *fanoutv1.ExecuteRequest {
	b, err := proto.Marshal(d)
	if err != nil {
		panic(err)
	}
	return &fanoutv1.ExecuteRequest{Dispatch: b, Signature: testSigner.SignDispatch(b), KeyId: testSigner.KeyID()}
}

func request(b *bundle, taskID string) *fanoutv1.Dispatch {
	return &fanoutv1.Dispatch{
		RunId: b.runID, TenantId: "t1", Goal: "learn",
		Task: &fanoutv1.TaskSpec{Id: taskID, Instruction: "find facts", TokenBudget: 50_000,
			AllowedTools: []string{"search", "fetch"}},
		TaskAccountId: int64(b.accts.Tasks[taskID]), MinReservationTokens: 50, Attempt: 1,
		AttemptSecret: "the tests' node login is not asked for it",
		Model:         &fanoutv1.ModelSettings{Provider: "sim", MaxOutputTokens: 200},
	}
}

// collect reads a stream to its end. Streams are opened on within(t): one
// that does not end within patience fails t.
func collect(t *testing.T, stream grpc.ServerStreamingClient[fanoutv1.ExecuteResponse]) ([]*fanoutv1.ExecuteResponse, error) {
	t.Helper()
	var out []*fanoutv1.ExecuteResponse
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if status.Code(err) == codes.DeadlineExceeded {
			t.Fatalf("the Execute stream did not end within %v (after %d messages): %v", backstop, len(out), err)
		}
		if err != nil {
			return out, err
		}
		out = append(out, msg)
	}
}

func TestServerExecute(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	sim := newSim(t, llm.SimConfig{ToolCallsPerIteration: 2, FinishAfter: 2, InputTokens: 100, OutputTokens: 50})
	client := serve(t, newServer(t, b, sim, nil))

	stream, err := client.Execute(within(t), signed(request(b, "a")))
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := collect(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 4 || msgs[0].GetStarted().GetWorker() != "w1" ||
		msgs[1].GetIteration().GetIteration() != 1 || msgs[1].GetIteration().GetToolCalls() != 2 ||
		msgs[2].GetIteration().GetIteration() != 2 || msgs[3].GetSummary() == nil {
		t.Fatalf("stream = %v; want started, 2 iterations, summary", msgs)
	}
	sum := msgs[3].GetSummary()
	if sum.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED || sum.GetError() != "" ||
		len(sum.GetFacts()) != 3 || sum.GetIterations() != 2 || sum.GetTokensSpent() != 300 {
		t.Errorf("summary = %v", sum)
	}
	if got := b.account(t, "a").Spent; got != sum.GetTokensSpent() {
		t.Errorf("ledger spent %d, summary %d", got, sum.GetTokensSpent())
	}
	b.checkLedger(t)
}

func TestServerInvalidArgument(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	client := serve(t, newServer(t, b, newSim(t, llm.SimConfig{}), nil))
	for _, tc := range []struct {
		field string
		mod   func(*fanoutv1.Dispatch)
	}{
		{"run_id", func(r *fanoutv1.Dispatch) { r.RunId = "" }},
		{"task_account_id", func(r *fanoutv1.Dispatch) { r.TaskAccountId = 0 }},
		{"attempt_secret", func(r *fanoutv1.Dispatch) { r.AttemptSecret = "" }},
		{"task", func(r *fanoutv1.Dispatch) { r.Task = nil }},
		{"task.instruction", func(r *fanoutv1.Dispatch) { r.Task.Instruction = "" }},
		{"task.allowed_tools[1]", func(r *fanoutv1.Dispatch) { r.Task.AllowedTools = []string{"search", "rm"} }},
		{"model.provider", func(r *fanoutv1.Dispatch) { r.Model.Provider = "nope" }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			req := request(b, "a")
			tc.mod(req)
			stream, err := client.Execute(within(t), signed(req))
			if err == nil {
				_, err = collect(t, stream)
			}
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument {
				t.Fatalf("err = %v, want INVALID_ARGUMENT", err)
			}
			var fields []string
			for _, d := range st.Details() {
				if br, ok := d.(*errdetails.BadRequest); ok {
					for _, v := range br.GetFieldViolations() {
						fields = append(fields, v.GetField())
					}
				}
			}
			if len(fields) != 1 || fields[0] != tc.field {
				t.Errorf("violations name %q, want %q", fields, tc.field)
			}
		})
	}
	if n := len(b.reservations(t)); n != 0 {
		t.Errorf("%d reservations after invalid requests", n)
	}
}

func TestServerWorkerFull(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000, "b": 50_000})
	model := newGated(newSim(t, llm.SimConfig{FinishAfter: 1}))
	client := serve(t, newServer(t, b, model, func(c *subagent.ServerConfig) { c.Capacity = 1 }))

	first, err := client.Execute(within(t), signed(request(b, "a")))
	if err != nil {
		t.Fatal(err)
	}
	waitStarted(t, model) // the first holds the only slot, mid-call

	second, err := client.Execute(within(t), signed(request(b, "b")))
	if err == nil {
		_, err = collect(t, second)
	}
	st := status.Convert(err)
	var reason string
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			reason = info.GetReason()
		}
	}
	if st.Code() != codes.ResourceExhausted || reason != "WORKER_FULL" {
		t.Errorf("second: %v (reason %q), want RESOURCE_EXHAUSTED WORKER_FULL", err, reason)
	}
	if res := b.reservations(t); len(res) != 1 {
		t.Errorf("reservations %+v: the refused task must reserve nothing", res)
	}
	close(model.release)
	if _, err := collect(t, first); err != nil {
		t.Fatal(err)
	}
	b.checkLedger(t)
}

// TestServerClientCancel cancels the Execute call mid-call: the worker
// settles the in-flight reservation estimated at its full amount.
func TestServerClientCancel(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	model := newGated(newSim(t, llm.SimConfig{}))
	srv := newServer(t, b, model, nil)
	client := serve(t, srv)

	ctx, cancel := context.WithCancel(within(t))
	stream, err := client.Execute(ctx, signed(request(b, "a")))
	if err != nil {
		t.Fatal(err)
	}
	waitStarted(t, model)
	cancel()
	if _, err := collect(t, stream); status.Code(err) != codes.Canceled {
		t.Errorf("err = %v, want CANCELED", err)
	}
	poll(t, "the subagent to end", func() bool { return srv.Running() == 0 })
	res := b.reservations(t)
	if len(res) != 1 || res[0].State != "settled" || !res[0].Estimated || res[0].Spent != res[0].Amount {
		t.Errorf("reservations %+v: want one settled estimated at its full amount", res)
	}
	b.checkLedger(t)
}

// TestServerRunCancelledByWatcher cancels the run in the ledger: the
// watcher hears it (NOTIFY or poll) and the worker cancels the call.
func TestServerRunCancelledByWatcher(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	w := runWatcher(t, b)
	model := newGated(newSim(t, llm.SimConfig{}))
	client := serve(t, newServer(t, b, model, func(c *subagent.ServerConfig) { c.Watcher = w }))

	stream, err := client.Execute(within(t), signed(request(b, "a")))
	if err != nil {
		t.Fatal(err)
	}
	waitStarted(t, model)
	if _, err := b.ledger.CancelRun(t.Context(), b.runID, "caller cancelled"); err != nil {
		t.Fatal(err)
	}
	// The model call holds until its context ends: only the worker acting
	// on the watcher's signal ends it.
	poll(t, "the worker to cancel and settle its call after the run was cancelled in the ledger", func() bool {
		res := b.reservations(t)
		return len(res) == 1 && res[0].State != "held"
	})
	msgs, err := collect(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	sum := msgs[len(msgs)-1].GetSummary()
	if sum.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_CANCELLED || sum.GetError() == "" {
		t.Errorf("summary %v, want CANCELLED with the cause", sum)
	}
	res := b.reservations(t)
	if len(res) != 1 || !res[0].Estimated || res[0].State != "settled" {
		t.Errorf("reservations %+v", res)
	}
	b.checkLedger(t)
}

// TestServerShutdown drains: new calls are refused, and when the deadline
// passes the running subagent is cancelled and its reservation settled.
func TestServerShutdown(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000, "b": 50_000})
	model := newGated(newSim(t, llm.SimConfig{}))
	srv := newServer(t, b, model, nil)
	client := serve(t, srv)

	stream, err := client.Execute(within(t), signed(request(b, "a")))
	if err != nil {
		t.Fatal(err)
	}
	waitStarted(t, model)

	ctx, cancel := context.WithCancel(t.Context())
	shutdown := make(chan error, 1)
	go func() { shutdown <- srv.Shutdown(ctx) }()
	// The probe is a's envelope again: refused as a replay (ALREADY_EXISTS)
	// until the server drains, then UNAVAILABLE, and never run, whichever
	// comes first, Shutdown or the probe (a fresh task's probe could start
	// before Shutdown and wait on the gate for good).
	poll(t, "new calls to be refused", func() bool {
		s, err := client.Execute(within(t), signed(request(b, "a")))
		if err == nil {
			_, err = collect(t, s)
		}
		return status.Code(err) == codes.Unavailable
	})
	cancel() // the drain deadline passes
	if err := await(t, shutdown, "Shutdown returning after its drain deadline passed"); !errors.Is(err, context.Canceled) {
		t.Errorf("Shutdown = %v, want context.Canceled", err)
	}
	msgs, err := collect(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	if sum := msgs[len(msgs)-1].GetSummary(); sum.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_CANCELLED {
		t.Errorf("summary %v, want CANCELLED", sum)
	}
	res := b.reservations(t)
	if len(res) != 1 || res[0].State != "settled" || !res[0].Estimated {
		t.Errorf("reservations %+v: want the in-flight one settled estimated", res)
	}
	b.checkLedger(t)
}

// runWatcher runs a watcher of b's database (polling every 50 ms) until the
// test ends.
func runWatcher(t *testing.T, b *bundle) *budget.Watcher {
	t.Helper()
	notifier := store.NewNotifier(b.url, store.NotifierConfig{})
	storetest.Background(t, notifier.Run)
	w := budget.NewWatcher(store.NewWatchSource(b.pool, notifier), budget.WatcherConfig{PollInterval: 50 * time.Millisecond})
	wctx, stopWatcher := context.WithCancel(context.Background())
	watcherDone := make(chan struct{})
	go func() {
		defer close(watcherDone)
		_ = w.Run(wctx)
	}()
	t.Cleanup(func() {
		stopWatcher()
		await(t, watcherDone, "the watcher stopping")
	})
	return w
}
