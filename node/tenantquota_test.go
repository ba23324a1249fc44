package node_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fanout/fanout/node"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// TestTenantQuotaKeepsOtherTenantsServed (issue 23 item 2): after
// authentication a tenant holds at most its quota of the process's calls
// (a quarter of --max-streams by default, --tenant-max-streams when set).
// Tenant globex holds its quota in WatchRun streams; its next call, stream
// or unary, is refused RESOURCE_EXHAUSTED with a QuotaFailure naming the
// limit, while acme's ListRuns, GetRun, StartRun and WatchRun are served.
// On main globex took every slot of the process and acme was refused.
func TestTenantQuotaKeepsOtherTenantsServed(t *testing.T) {
	const readTimeout = 300 * time.Millisecond // --unauthenticated-read-timeout
	t.Parallel()
	for _, tc := range []struct {
		name       string
		maxStreams int
		tenantMax  int
		want       int // the quota in force
	}{
		{"default quarter", 12, 0, 3},
		{"set", 12, 5, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := storetest.NewDB(t)
			_, workerTrust, _, err := node.DevTrust(peerDir)
			if err != nil {
				t.Fatal(err)
			}
			w, err := node.OpenWorker(t.Context(), backend(t, url, node.BackendConfig{}), node.WorkerConfig{Trust: workerTrust,
				Sim: llm.SimConfig{Latency: time.Minute}, Server: subagent.ServerConfig{Name: "w1"}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = w.Close(context.Background()) })
			b := backend(t, url, node.BackendConfig{MaxStreams: tc.maxStreams, TenantMaxStreams: tc.tenantMax,
				UnauthenticatedReadTimeout: readTimeout})
			o := startOrchestrator(t, b, node.OrchestratorConfig{Workers: w.Addr()})
			globex := fanoutv1.NewOrchestratorServiceClient(dialKey(t, o.Addr(), newTenantKey(t, b, "globex")))
			acme := fanoutv1.NewOrchestratorServiceClient(dialKey(t, o.Addr(), newTenantKey(t, b, "acme")))
			start := func(c fanoutv1.OrchestratorServiceClient, key string) (string, error) {
				r, err := c.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: &fanoutv1.RunSpec{
					IdempotencyKey: key, Goal: "wait", Budget: &fanoutv1.Budget{LimitTokens: 10_000},
					Model: &fanoutv1.ModelSettings{Provider: "sim"},
					Tasks: []*fanoutv1.TaskSpec{{Id: "t1", Instruction: "take a minute", TokenBudget: 5_000}}}})
				return r.GetRunId(), err
			}
			// cancelRun ends a minute-long run now, not at shutdown; it waits
			// (5 s at most) for the streams just cancelled to give back the
			// tenant's slots.
			cancelRun := func(c fanoutv1.OrchestratorServiceClient, id string) {
				ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 5*time.Second)
				defer cancel()
				for {
					_, err := c.CancelRun(ctx, &fanoutv1.CancelRunRequest{RunId: id})
					if status.Code(err) != codes.ResourceExhausted || ctx.Err() != nil {
						return
					}
					select {
					case <-ctx.Done():
					case <-time.After(20 * time.Millisecond):
					}
				}
			}
			run, err := start(globex, "g")
			if err != nil {
				t.Fatal(err)
			}
			defer cancelRun(globex, run) // end the minute-long run now, not at shutdown
			watch := func(ctx context.Context, c fanoutv1.OrchestratorServiceClient, id string) error {
				s, err := c.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: id})
				if err != nil {
					return err
				}
				_, err = s.Recv() // the first event: the stream is being served
				return err
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			for i := range tc.want {
				if err := watch(ctx, globex, run); err != nil {
					t.Fatalf("globex's WatchRun %d of %d: %v", i+1, tc.want, err)
				}
			}
			wantQuota := func(call string, err error) {
				t.Helper()
				st := status.Convert(err)
				if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), fmt.Sprintf("at most %d concurrent calls", tc.want)) ||
					!strings.Contains(st.Message(), "--tenant-max-streams") {
					t.Fatalf("globex's %s past its quota: %v; want RESOURCE_EXHAUSTED naming the quota of %d", call, err, tc.want)
				}
				for _, d := range st.Details() {
					if q, ok := d.(*errdetails.QuotaFailure); ok && len(q.GetViolations()) == 1 &&
						q.GetViolations()[0].GetSubject() == "tenant:globex" &&
						strings.Contains(q.GetViolations()[0].GetDescription(), fmt.Sprintf("at most %d concurrent calls", tc.want)) {
						return
					}
				}
				t.Fatalf("globex's %s past its quota: details %v; want a QuotaFailure on tenant:globex naming %d", call, st.Details(), tc.want)
			}
			wantQuota("WatchRun", watch(t.Context(), globex, run))
			_, err = globex.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: run})
			wantQuota("GetRun", err)
			// A key of globex never seen on this replica: its first call is
			// unverified in the tap, and held to the quota once authenticated.
			fresh := fanoutv1.NewOrchestratorServiceClient(dialKey(t, o.Addr(), newTenantKey(t, b, "globex")))
			_, err = fresh.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: run})
			wantQuota("first call of a new key", err)

			// Another tenant is served: unary and streaming.
			if _, err := acme.ListRuns(t.Context(), &fanoutv1.ListRunsRequest{}); err != nil {
				t.Errorf("acme's ListRuns while globex holds its quota: %v", err)
			}
			mine, err := start(acme, "a")
			if err != nil {
				t.Fatalf("acme's StartRun while globex holds its quota: %v", err)
			}
			defer cancelRun(acme, mine)
			if _, err := acme.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: mine}); err != nil {
				t.Errorf("acme's GetRun while globex holds its quota: %v", err)
			}
			actx, acancel := context.WithCancel(t.Context())
			defer acancel()
			if err := watch(actx, acme, mine); err != nil {
				t.Errorf("acme's WatchRun while globex holds its quota: %v", err)
			}
			// A stream that is a new key's first call was read before
			// authentication; once authenticated, --unauthenticated-read-timeout
			// no longer applies to it.
			newAcme := fanoutv1.NewOrchestratorServiceClient(dialKey(t, o.Addr(), newTenantKey(t, b, "acme")))
			s, err := newAcme.WatchRun(actx, &fanoutv1.WatchRunRequest{RunId: mine})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Recv(); err != nil {
				t.Fatalf("a new key's first WatchRun: %v", err)
			}
			ended := make(chan error, 1)
			go func() {
				for {
					if _, err := s.Recv(); err != nil {
						ended <- err
						return
					}
				}
			}()
			select {
			case err := <-ended:
				t.Errorf("a new key's first WatchRun ended after it was authenticated: %v; want it open past the %s read timeout", err, readTimeout)
			case <-time.After(readTimeout + time.Second):
			}
		})
	}
}
