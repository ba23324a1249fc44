package node_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

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
	b := backend(t, storetest.NewDB(t), node.BackendConfig{})
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
	burst(t, "gRPC", func(i int) error {
		_, err := fanoutv1.NewOrchestratorServiceClient(conns[i%len(conns)]).ListRuns(ctx, &fanoutv1.ListRunsRequest{})
		return err
	})

	token = newScopedKey(t, b, "acme", "read")
	base := "http://" + o.HTTPAddr()
	burst(t, "HTTP", func(int) error {
		code, out, err := sendHTTP(ctx, base+"/fanout.v1.OrchestratorService/ListRuns", "application/json", token, []byte("{}"), false)
		if err == nil && code != http.StatusOK {
			return &httpError{code: code, body: out}
		}
		return err
	})
}

// burst sends burstCalls calls with call at once and fails the test for
// each one that is not served.
func burst(t *testing.T, door string, call func(i int) error) {
	t.Helper()
	errs := make([]error, burstCalls)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() {
			<-start
			errs[i] = call(i)
		})
	}
	close(start)
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

type httpError struct {
	code int
	body string
}

func (e *httpError) Error() string {
	return http.StatusText(e.code) + ": " + e.body[:min(len(e.body), 300)]
}
