package node_test

import (
	"bytes"
	"context"
	"log/slog"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fanout/fanout/auth"
	"github.com/fanout/fanout/node"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// rawCodec sends a request already encoded (a *[]byte), so that 48 callers
// share one 7 MiB body: the heap the test measures is the server's.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)   { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(_ []byte, _ any) error { return nil }
func (rawCodec) Name() string                    { return "proto" }

// bearerCreds sends token as the call's bearer credential.
type bearerCreds struct{ token string }

func (b bearerCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}
func (bearerCreds) RequireTransportSecurity() bool { return false }

// dialKey is a connection to addr that calls with token ("" for none).
func dialKey(t testing.TB, addr, token string) *grpc.ClientConn {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearerCreds{token: token}))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// newTenantKey creates tenant (unless it exists) and a run/read/cancel key
// of it, and returns the key's token.
func newTenantKey(t *testing.T, b *node.Backend, tenantID string) string {
	t.Helper()
	return newScopedKey(t, b, tenantID, "run", "read", "cancel")
}

// heapPeak samples the heap in use until stop closes and returns the
// largest sample.
func heapPeak(stop <-chan struct{}) <-chan uint64 {
	out := make(chan uint64, 1)
	go func() {
		var peak uint64
		var ms runtime.MemStats
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-stop:
				out <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return out
}

// bound is how far the heap in use may grow above idle with budget bytes
// admitted unauthenticated: 3× the budget (each admitted call's raw body,
// its decoded copy, transport buffers) and the GC's 20% over the live heap,
// with 16 MiB of margin.
func bound(idle uint64, budget int) uint64 {
	live := idle + 3*uint64(budget)
	return live + live/5 + 16<<20 - idle
}

// growth is how far peak is above idle (0 if below).
func growth(peak, idle uint64) uint64 { return peak - min(peak, idle) }

func idleHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// TestUnauthenticatedFloodHeapIsBounded: 48 concurrent keyless StartRun
// calls with a 7 MiB goal against an orchestrator with API keys (issue 23
// item 1) are refused before their bodies are read: the heap in use grows by
// less than 3× the unauthenticated budget (the raw body and its decoded goal
// of each admitted call, plus transport buffers) and 16 MiB of margin,
// where on main every body was read and decoded (hundreds of MiB). A flood
// of well-formed but unknown keys, which the tap cannot tell from real ones,
// is held to the budget the same way (the calls past it refused
// RESOURCE_EXHAUSTED), and a caller whose key is verified still gets
// through during it.
//
// It runs alone (no t.Parallel): the heap it measures is the process's. The
// GC runs at 20% growth meanwhile, so that garbage does not count as
// in use: the bound is 1.2 × (idle + 3 × budget) + 16 MiB.
func TestUnauthenticatedFloodHeapIsBounded(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(20))
	const floodCalls = 48
	const maxSpec = 4 << 20 // the default: a receive limit of 8 MiB + 1 KiB
	recvLimit := 2*maxSpec + 1024
	budget := 2 * recvLimit // two unauthenticated calls in flight
	b, o := openOrchestrator(t, node.BackendConfig{UnauthenticatedBytes: int64(budget)})
	token := newTenantKey(t, b, "acme")
	good := fanoutv1.NewOrchestratorServiceClient(dialKey(t, o.Addr(), token))
	if _, err := good.ListRuns(t.Context(), &fanoutv1.ListRunsRequest{}); err != nil {
		t.Fatalf("ListRuns with a valid key before the flood: %v", err)
	}

	body, err := proto.Marshal(&fanoutv1.StartRunRequest{Spec: &fanoutv1.RunSpec{IdempotencyKey: "big",
		Goal: strings.Repeat("g", 7<<20), Budget: &fanoutv1.Budget{LimitTokens: 1000},
		Tasks: []*fanoutv1.TaskSpec{{Id: "t", Instruction: "x", TokenBudget: 100}}}})
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]*grpc.ClientConn, floodCalls)
	for i := range conns {
		conns[i] = dialKey(t, o.Addr(), "")
		conns[i].Connect()
	}
	call := func(ctx context.Context, conn *grpc.ClientConn, opts ...grpc.CallOption) error {
		var out []byte
		return conn.Invoke(ctx, fanoutv1.OrchestratorService_StartRun_FullMethodName, &body, &out,
			append(opts, grpc.ForceCodec(rawCodec{}))...)
	}
	// Keyless: every call refused UNAUTHENTICATED, the heap bounded.
	idle := idleHeap()
	limit := bound(idle, budget)
	stop := make(chan struct{})
	peak := heapPeak(stop)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	errs := make([]error, floodCalls)
	var wg sync.WaitGroup
	for i, conn := range conns {
		wg.Go(func() { errs[i] = call(ctx, conn) })
	}
	wg.Wait()
	close(stop)
	grew := growth(<-peak, idle)
	t.Logf("keyless flood: heap in use grew by %d MiB over %d MiB idle (bound %d MiB)", grew>>20, idle>>20, limit>>20)
	if grew > limit {
		t.Errorf("keyless flood: heap in use grew by %d MiB (idle %d MiB); want under %d MiB (3× the %d MiB budget + 16 MiB)",
			grew>>20, idle>>20, limit>>20, budget>>20)
	}
	for i, err := range errs {
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("keyless StartRun %d: %v; want UNAUTHENTICATED", i, err)
		}
	}

	// Unknown keys, calling until the verified caller is done.
	idle = idleHeap()
	limit = bound(idle, budget)
	stop, done := make(chan struct{}), make(chan struct{})
	peak = heapPeak(done)
	var refused, unauthenticated atomic.Int64
	errc := make(chan error, floodCalls)
	var halted sync.Once
	halt := func() { // every flood goroutine and the sampler end, whatever failed
		halted.Do(func() {
			close(stop)
			wg.Wait()
			close(done)
			close(errc)
		})
	}
	defer halt()
	full := make(chan struct{})
	var fullOnce sync.Once
	for _, conn := range conns {
		_, fake, _, err := auth.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := call(ctx, conn, grpc.PerRPCCredentials(bearerCreds{token: fake}))
				switch status.Code(err) {
				case codes.ResourceExhausted:
					refused.Add(1)
					fullOnce.Do(func() { close(full) })
				case codes.Unauthenticated:
					unauthenticated.Add(1)
				default:
					errc <- err
					return
				}
			}
		})
	}
	select {
	case <-full:
	case err := <-errc:
		t.Fatalf("StartRun with an unknown key: %v; want UNAUTHENTICATED or RESOURCE_EXHAUSTED", err)
	case <-time.After(20 * time.Second):
		t.Fatal("no call of the unknown-key flood was refused RESOURCE_EXHAUSTED within 20 s: no budget")
	}
	for i := range 3 {
		if _, err := good.ListRuns(ctx, &fanoutv1.ListRunsRequest{}); err != nil {
			t.Errorf("ListRuns %d with a verified key during the flood: %v", i+1, err)
		}
	}
	halt()
	for err := range errc {
		t.Errorf("StartRun with an unknown key: %v; want UNAUTHENTICATED or RESOURCE_EXHAUSTED", err)
	}
	grew = growth(<-peak, idle)
	t.Logf("unknown-key flood: heap in use grew by %d MiB over %d MiB idle (bound %d MiB)", grew>>20, idle>>20, limit>>20)
	if grew > limit {
		t.Errorf("unknown-key flood: heap in use grew by %d MiB (idle %d MiB); want under %d MiB", grew>>20, idle>>20, limit>>20)
	}
	t.Logf("unknown-key flood: %d refused RESOURCE_EXHAUSTED, %d UNAUTHENTICATED", refused.Load(), unauthenticated.Load())
	// The budget is free again: a key not yet verified reaches the service,
	// which refuses the 7 MiB spec itself.
	fresh := newTenantKey(t, b, "acme")
	if err := call(t.Context(), conns[0], grpc.PerRPCCredentials(bearerCreds{token: fresh})); status.Code(err) != codes.ResourceExhausted ||
		!strings.Contains(status.Convert(err).Message(), "spec") {
		t.Errorf("a new key's StartRun of a 7 MiB spec after the flood: %v; want the service's RESOURCE_EXHAUSTED on the spec", err)
	}
}

// TestARevokedStreamIsNoInternalError: a WatchRun open on a key that is
// then revoked ends UNAUTHENTICATED, and the orchestrator logs no "internal
// error" for it. The stream's context ends with the revocation as its
// cause, which the watch returns; the cause did not say it was
// UNAUTHENTICATED, so the service took it for an unexpected error and
// logged it at ERROR (the caller still got UNAUTHENTICATED, which the
// authenticator's interceptor put over it).
func TestARevokedStreamIsNoInternalError(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	var mu sync.Mutex
	b, err := node.OpenBackend(t.Context(), node.BackendConfig{DatabaseURL: storetest.NewDB(t),
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	o := startOrchestrator(t, b, node.OrchestratorConfig{Workers: "127.0.0.1:1"})
	token := newScopedKey(t, b, "acme", "run", "read", "cancel")
	client := fanoutv1.NewOrchestratorServiceClient(dialKey(t, o.Addr(), token))
	started, err := client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: &fanoutv1.RunSpec{
		IdempotencyKey: "watched", Goal: "g", Budget: &fanoutv1.Budget{LimitTokens: 10_000},
		Model: &fanoutv1.ModelSettings{Provider: "sim"},
		Tasks: []*fanoutv1.TaskSpec{{Id: "t1", Instruction: "x", TokenBudget: 5_000}}}})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := client.WatchRun(t.Context(), &fanoutv1.WatchRunRequest{RunId: started.GetRunId()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil { // open and authenticated
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	keyID, _, err := auth.ParseToken(token)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.NewKeys(b.Pool(), nil).RevokeKey(t.Context(), storetest.Actor(t, b.Pool()), keyID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ended:
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("the stream of a revoked key ended with %v, want UNAUTHENTICATED", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream of a revoked key was still open 10s after the revocation")
	}
	// End the run with another key, then close the orchestrator, which waits
	// for the handler (it returns after the caller has its answer), before
	// reading the log.
	other := fanoutv1.NewOrchestratorServiceClient(dialKey(t, o.Addr(), newScopedKey(t, b, "acme", "cancel")))
	if _, err := other.CancelRun(t.Context(), &fanoutv1.CancelRunRequest{RunId: started.GetRunId()}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = o.Close(ctx)
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(logs.String(), "internal error") {
		t.Errorf("a revoked key's stream was logged as an internal error:\n%s", logs.String())
	}
}
