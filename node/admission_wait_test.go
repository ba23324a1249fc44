package node_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fanout/fanout/auth"
	"github.com/fanout/fanout/node"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store/storetest"
)

// stalledCall opens a call of method on conn and sends its headers but never its
// request, as a caller trickling its body would; its channel gets the
// call's end.
func stalledCall(t *testing.T, conn *grpc.ClientConn, method string) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true},
		method, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		var out []byte
		ended <- s.RecvMsg(&out)
	}()
	return ended
}

// openOrchestrator is an orchestrator wired as `fanout orchestrator --auth
// keys` wires it, on a new database with backend config cfg, with no worker.
func openOrchestrator(t *testing.T, cfg node.BackendConfig) (*node.Backend, *node.Orchestrator) {
	t.Helper()
	b := backend(t, storetest.NewDB(t), cfg)
	return b, startOrchestrator(t, b, node.OrchestratorConfig{Workers: "127.0.0.1:1"})
}

// startOrchestrator opens an orchestrator on b with cfg (the test peer
// keys as its trust) and closes it when the test ends.
func startOrchestrator(t testing.TB, b *node.Backend, cfg node.OrchestratorConfig) *node.Orchestrator {
	t.Helper()
	orchTrust, _, _, err := node.DevTrust(peerDir)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Trust = orchTrust
	o, err := node.OpenOrchestrator(t.Context(), b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = o.Close(ctx)
	})
	return o
}

// TestUnauthenticatedCallEndsAfterTheReadTimeout (issue 23, from its
// review; issue 40): a call admitted before authentication held its share
// of --unauthenticated-bytes until it ended, so a caller sending headers
// and then nothing held every share for as long as it liked. Now a
// made-up key is looked up before its body and refused UNAUTHENTICATED at
// once, however it stalls; what still holds a share unauthenticated (a
// health check, open to every caller) is ended after the read timeout: with
// a budget of one call and a timeout of 400 ms, a stalled health check
// takes the share, a second is refused RESOURCE_EXHAUSTED, the stalled one
// is ended (CANCELLED) in 400 ms to 1.4 s, and the share serves the next.
func TestUnauthenticatedCallEndsAfterTheReadTimeout(t *testing.T) {
	t.Parallel()
	const wait = 400 * time.Millisecond
	const recvLimit = 8<<20 + 1024    // the default receive limit
	_, token, _, err := auth.NewKey() // well formed, never created
	if err != nil {
		t.Fatal(err)
	}
	// A made-up key, on an orchestrator whose read timeout (5 s) is long
	// enough that only the lookup can end the call sooner, on any machine.
	_, patient := openOrchestrator(t, node.BackendConfig{UnauthenticatedBytes: recvLimit, UnauthenticatedReadTimeout: 5 * time.Second})
	start := time.Now()
	select {
	case err := <-stalledCall(t, dialKey(t, patient.Addr(), token), fanoutv1.OrchestratorService_StartRun_FullMethodName):
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("a stalled call with a made-up key ended after %s with %v; want UNAUTHENTICATED before its body, "+
				"not the read timeout's end", time.Since(start), err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a stalled call with a made-up key still open after 10 s: its key was not looked up before its body")
	}

	_, o := openOrchestrator(t, node.BackendConfig{UnauthenticatedBytes: recvLimit, UnauthenticatedReadTimeout: wait})
	conn := dialKey(t, o.Addr(), token)

	health := healthpb.Health_Check_FullMethodName
	start = time.Now()
	ended := stalledCall(t, conn, health)
	// The share is taken: a second health check is refused before its
	// body is read. (Retried until the stalled call's headers have arrived.)
	deadline := time.Now().Add(5 * time.Second)
	for {
		var out []byte
		body := []byte{}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		err := conn.Invoke(ctx, health, &body, &out, grpc.ForceCodec(rawCodec{}))
		cancel()
		if status.Code(err) == codes.ResourceExhausted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a second health check while the first stalls: %v; want RESOURCE_EXHAUSTED", err)
		}
	}
	select {
	case err := <-ended:
		took := time.Since(start)
		t.Logf("the stalled call ended after %s: %v", took, err)
		if status.Code(err) != codes.Canceled || took < wait || took > wait+time.Second {
			t.Errorf("the stalled call ended after %s with %v; want CANCELLED after %s to %s", took, err, wait, wait+time.Second)
		}
	case <-time.After(wait + 5*time.Second):
		t.Fatalf("the stalled call still open %s after its start; want it ended after %s", wait+5*time.Second, wait)
	}
	// The share comes back when the server's side of the stalled call has
	// ended, which the client may hear of first: the next health check is
	// admitted within a second of it.
	release := time.Now().Add(time.Second)
	for {
		var out []byte
		body := []byte{}
		err := conn.Invoke(t.Context(), health, &body, &out, grpc.ForceCodec(rawCodec{}))
		if status.Code(err) == codes.ResourceExhausted && time.Now().Before(release) {
			continue
		}
		if err != nil {
			t.Errorf("the next health check: %v; want it served", err)
		}
		return
	}
}

// TestStalledRequestGivesItsChargeBack (issue 40): a call holding its
// charge of the request-bytes budget while it sends nothing would hold it
// for ever, and a tenant's (or two tenants') few stalled calls the whole
// process's budget. With the default charges (16 MiB a gRPC call before its
// request is read, a 64 MiB + 4 KiB share: four at once), a wait for a
// share of 300 ms and a request read timeout of 2 s: four stalled calls of
// acme hold its share, a fifth waits its 300 ms and is refused
// RESOURCE_EXHAUSTED naming --tenant-request-bytes, the four are ended
// (CANCELLED) after 2 to 3 s, and acme is served again.
func TestStalledRequestGivesItsChargeBack(t *testing.T) {
	t.Parallel()
	const read = 2 * time.Second
	const share = 4*(16<<20+2048) + 4096 // four gRPC charges; at least one HTTP charge (64 MiB + 4 KiB)
	b, o := openOrchestrator(t, node.BackendConfig{TenantRequestBytes: share, RequestBytesWait: 300 * time.Millisecond,
		RequestReadTimeout: read})
	conn := dialKey(t, o.Addr(), newScopedKey(t, b, "acme", "run", "read"))
	client := fanoutv1.NewOrchestratorServiceClient(conn)
	if _, err := client.ListRuns(t.Context(), &fanoutv1.ListRunsRequest{}); err != nil {
		t.Fatal(err) // the key verified and cached
	}
	start := time.Now()
	var stalled []<-chan error
	for range 4 {
		stalled = append(stalled, stalledCall(t, conn, fanoutv1.OrchestratorService_StartRun_FullMethodName))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := client.ListRuns(t.Context(), &fanoutv1.ListRunsRequest{})
		if status.Code(err) == codes.ResourceExhausted {
			if !strings.Contains(err.Error(), "--tenant-request-bytes") {
				t.Errorf("the fifth call: %v; want the share named", err)
			}
			break
		}
		if time.Since(start) > read*3/4 || time.Now().After(deadline) {
			t.Fatalf("a fifth call while four stall: %v; want RESOURCE_EXHAUSTED (the share held)", err)
		}
	}
	for i, ended := range stalled {
		select {
		case err := <-ended:
			took := time.Since(start)
			if status.Code(err) != codes.Canceled || took < read || took > read+time.Second {
				t.Errorf("stalled call %d ended after %s with %v; want CANCELLED after %s to %s", i, took, err, read, read+time.Second)
			}
		case <-time.After(read + 5*time.Second):
			t.Fatalf("stalled call %d still open %s after its start", i, read+5*time.Second)
		}
	}
	release := time.Now().Add(time.Second)
	for {
		_, err := client.ListRuns(t.Context(), &fanoutv1.ListRunsRequest{})
		if status.Code(err) == codes.ResourceExhausted && time.Now().Before(release) {
			continue
		}
		if err != nil {
			t.Errorf("acme after its stalled calls ended: %v; want served", err)
		}
		return
	}
}

// TestVerifiedKeyTakesItsTenantsSlotBeforeItsBody (issue 23, from its
// review): a key verified on this replica skipped the budget read before
// authentication, and its tenant's quota was taken only once its request
// had been read, so one tenant could have any number of requests being
// read at once. Now the tap takes the tenant's slot before the body: with a
// quota of 2, two stalled calls of acme hold both, a third is refused
// RESOURCE_EXHAUSTED at once (naming the tenant), and globex is served.
func TestVerifiedKeyTakesItsTenantsSlotBeforeItsBody(t *testing.T) {
	t.Parallel()
	b, o := openOrchestrator(t, node.BackendConfig{MaxStreams: 20, TenantMaxStreams: 2})
	acmeConn := dialKey(t, o.Addr(), newTenantKey(t, b, "acme"))
	acme := fanoutv1.NewOrchestratorServiceClient(acmeConn)
	if _, err := acme.ListRuns(t.Context(), &fanoutv1.ListRunsRequest{}); err != nil { // verified, cached
		t.Fatalf("ListRuns with acme's key: %v", err)
	}
	stalled := []<-chan error{stalledCall(t, acmeConn, fanoutv1.OrchestratorService_StartRun_FullMethodName), stalledCall(t, acmeConn, fanoutv1.OrchestratorService_StartRun_FullMethodName)}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		_, err := acme.ListRuns(ctx, &fanoutv1.ListRunsRequest{})
		cancel()
		if status.Code(err) == codes.ResourceExhausted {
			if st := status.Convert(err); !strings.Contains(st.Message(), "tenant:acme") {
				t.Errorf("refusal %q does not name tenant:acme", st.Message())
			}
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("acme's third call while two of its requests are being read: %v; want RESOURCE_EXHAUSTED", err)
		}
	}
	third := stalledCall(t, acmeConn, fanoutv1.OrchestratorService_StartRun_FullMethodName)
	select {
	case err := <-third:
		if status.Code(err) != codes.ResourceExhausted {
			t.Errorf("acme's third stalled call: %v; want RESOURCE_EXHAUSTED before its body", err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("acme's third stalled call still open after 5s: it took no slot before its body")
	}
	globex := fanoutv1.NewOrchestratorServiceClient(dialKey(t, o.Addr(), newTenantKey(t, b, "globex")))
	if _, err := globex.ListRuns(t.Context(), &fanoutv1.ListRunsRequest{}); err != nil {
		t.Errorf("globex while acme's quota is full: %v", err)
	}
	for _, c := range stalled {
		select {
		case err := <-c:
			t.Errorf("a stalled call of a verified key ended: %v; it is authenticated and waits for its body", err)
		default:
		}
	}
}

// TestHeadersAreBoundedTo64KiB (issue 23, from its review): the headers of
// a call are held before anyone knows who sent it, and gRPC allowed 16 MiB
// of them. A caller's headers of 60 KiB reach authentication (an unknown
// key: UNAUTHENTICATED); of 70 KiB they are refused before it.
func TestHeadersAreBoundedTo64KiB(t *testing.T) {
	t.Parallel()
	_, o := openOrchestrator(t, node.BackendConfig{})
	_, token, _, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	c := fanoutv1.NewOrchestratorServiceClient(dialKey(t, o.Addr(), token))
	for _, tc := range []struct {
		size int
		ok   bool
	}{{60 << 10, true}, {70 << 10, false}} {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "x-padding", strings.Repeat("p", tc.size))
		_, err := c.ListRuns(ctx, &fanoutv1.ListRunsRequest{})
		authenticated := status.Code(err) == codes.Unauthenticated
		if authenticated != tc.ok {
			t.Errorf("a call with %d KiB of headers: %v; want it %s", tc.size>>10, err,
				map[bool]string{true: "to reach authentication (UNAUTHENTICATED)", false: "refused for its headers' size"}[tc.ok])
		}
		if !tc.ok && !strings.Contains(err.Error(), "header list size") {
			t.Errorf("a call with %d KiB of headers: %v; want a refusal naming the header list size", tc.size>>10, err)
		}
	}
}
