package node_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/fanout/fanout/node"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store/storetest"
)

// burstCalls is how many first calls a client sends at once in
// TestABurstOfANewKeysFirstCallsIsServed: the scale harness's 100 StartRuns.
const burstCalls = 100

// TestABurstOfANewKeysFirstCallsIsServed (issue 44): a client that opens
// its pool and sends its first calls at once, with a key this process has
// not seen yet (created after it started, so neither cached nor among the
// known ids), had all but 7 of them refused RESOURCE_EXHAUSTED "reads at
// most 7 unauthenticated calls at once": each took a share of the
// unauthenticated budget for its own lookup of the same key. Now the calls
// presenting one credential share one lookup and one share: all 100 are
// served, over gRPC (on four connections) and over HTTP.
func TestABurstOfANewKeysFirstCallsIsServed(t *testing.T) {
	url := storetest.NewDB(t)
	b := backend(t, url, node.BackendConfig{})
	o := startOrchestrator(t, b, node.OrchestratorConfig{Workers: "127.0.0.1:1", HTTP: node.HTTPConfig{Listen: "127.0.0.1:0"}})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	token := newScopedKey(t, b, "acme", "read")
	conns := make([]*grpc.ClientConn, 4)
	for i := range conns {
		conns[i] = dialKey(t, o.Addr(), token)
		conns[i].Connect()
		for s := conns[i].GetState(); s != connectivity.Ready; s = conns[i].GetState() {
			if !conns[i].WaitForStateChange(ctx, s) {
				t.Fatalf("connection %d: %v before it was ready", i, ctx.Err())
			}
		}
	}
	burst(t, url, "gRPC", func(i int) error {
		_, err := fanoutv1.NewOrchestratorServiceClient(conns[i%len(conns)]).ListRuns(ctx, &fanoutv1.ListRunsRequest{})
		return err
	})

	token = newScopedKey(t, b, "acme", "read")
	base := "http://" + o.HTTPAddr()
	burst(t, url, "HTTP", func(int) error {
		code, out, err := sendHTTP(ctx, base+"/fanout.v1.OrchestratorService/ListRuns", "application/json", token, []byte("{}"), false)
		if err == nil && code != http.StatusOK {
			return &httpError{code: code, body: out}
		}
		return err
	})
}

// burst sends burstCalls calls with call at once and fails the test for
// each one that is not served. The key's lookup is held (its table locked)
// until the lookup waits on the lock and every call has had a bounded time
// to reach the process, so the calls are all there while the key is not
// verified yet, however fast the database: a call answered meanwhile was
// refused, and the burst's calls are served only once the lock is let go.
func burst(t *testing.T, url, door string, call func(i int) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	hold, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hold.Close(context.WithoutCancel(ctx)) }()
	tx, err := hold.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "LOCK TABLE fanout.api_key IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}

	errs := make([]error, burstCalls)
	var answered atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() {
			<-start
			errs[i] = call(i)
			answered.Add(1)
		})
	}
	close(start)
	// The lookup waits on the lock: the key is being looked up.
	for waiting := false; !waiting; {
		if err := pause(ctx, 5*time.Millisecond); err != nil {
			t.Fatalf("%s: the key's lookup never waited on api_key's lock: %v", door, err)
		}
		if err := hold.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE NOT granted AND relation = 'fanout.api_key'::regclass)`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	// Meanwhile no call is answered: a refusal comes at once (gRPC) or
	// after its wait for a share (HTTP, longer than this).
	seen, cancelSeen := context.WithTimeout(ctx, 2*time.Second)
	for seen.Err() == nil && answered.Load() == 0 {
		_ = pause(seen, 10*time.Millisecond)
	}
	cancelSeen()
	if n := answered.Load(); n > 0 {
		t.Errorf("%s: %d calls answered while their key's lookup was held; want none (refused for want of a share?)", door, n)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	refused := 0
	for i, err := range errs {
		if err != nil {
			if refused++; refused <= 3 {
				t.Errorf("%s: first call %d of a new key's burst of %d: %v", door, i, burstCalls, err)
			}
		}
	}
	if refused > 0 {
		t.Errorf("%s: %d of the %d first calls of a new key's burst were not served; want none", door, refused, burstCalls)
	}
}

// pause waits d, or until ctx ends (its error): a poll's step.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

type httpError struct {
	code int
	body string
}

func (e *httpError) Error() string {
	return http.StatusText(e.code) + ": " + e.body[:min(len(e.body), 300)]
}
