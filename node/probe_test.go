package node_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/fanout/fanout/node"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store/storetest"
)

// TestProbePortServesHealthAlone (issue 27): --probe-listen serves the
// gRPC health service in plaintext and without an API key, as the
// kubelet's gRPC probes ask it (a worker's own port admits only
// orchestrators, over mutual TLS); it serves nothing else, answers
// SERVING while the node serves, and is gone once the node has stopped.
func TestProbePortServesHealthAlone(t *testing.T) {
	t.Parallel()
	b := backend(t, storetest.NewDB(t), node.BackendConfig{})
	_, workerTrust, _, err := node.DevTrust(peerDir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := node.OpenWorker(t.Context(), b, node.WorkerConfig{Trust: workerTrust, ProbeListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	o := startOrchestrator(t, b, node.OrchestratorConfig{Workers: w.Addr(), ProbeListen: "127.0.0.1:0"})
	for _, p := range []struct{ name, addr string }{{"worker", w.ProbeAddr()}, {"orchestrator", o.ProbeAddr()}} {
		if p.addr == "" {
			t.Fatalf("%s: no probe address", p.name)
		}
		conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%s probe: %v, %v; want SERVING", p.name, resp, err)
		}
		// Nothing but health: the services are not there.
		_, err = fanoutv1.NewOrchestratorServiceClient(conn).ListRuns(ctx, &fanoutv1.ListRunsRequest{})
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("%s probe port answered ListRuns with %v; want Unimplemented", p.name, err)
		}
		if stream, err := fanoutv1.NewSubagentServiceClient(conn).Execute(ctx, &fanoutv1.ExecuteRequest{}); err == nil {
			_, err = stream.Recv()
			if status.Code(err) != codes.Unimplemented {
				t.Errorf("%s probe port answered Execute with %v; want Unimplemented", p.name, err)
			}
		}
		cancel()
		_ = conn.Close()
	}
	// Once the worker has stopped its probe port is closed.
	probe := w.ProbeAddr()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(probe, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	cctx, ccancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer ccancel()
	if resp, err := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{}); err == nil {
		t.Errorf("stopped worker's probe answered %v; want no answer", resp)
	}
}
