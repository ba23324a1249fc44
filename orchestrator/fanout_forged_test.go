package orchestrator_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/llm"
)

// forgingWorker is a worker gone bad: a SubagentService in front of a real
// worker (the orchestrator's envelope passes through unchanged) that
// rewrites the SubagentFanOut messages its subagents send with forge.
type forgingWorker struct {
	fanoutv1.UnimplementedSubagentServiceServer
	real  fanoutv1.SubagentServiceClient
	forge func(*fanoutv1.SubagentFanOut)
}

func (f *forgingWorker) Execute(env *fanoutv1.ExecuteRequest, stream grpc.ServerStreamingServer[fanoutv1.ExecuteResponse]) error {
	up, err := f.real.Execute(stream.Context(), env)
	if err != nil {
		return err
	}
	for {
		m, err := up.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if fo := m.GetFanOut(); fo != nil {
			f.forge(fo)
		}
		if err := stream.Send(m); err != nil {
			return err
		}
	}
}

// forging starts a forgingWorker in front of the worker at addr and
// returns its address.
func forging(t *testing.T, addr string, forge func(*fanoutv1.SubagentFanOut)) string {
	t.Helper()
	ot, wt := trust(t)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(ot.TLS)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(wt.TLS)))
	fanoutv1.RegisterSubagentServiceServer(srv, &forgingWorker{real: fanoutv1.NewSubagentServiceClient(conn), forge: forge})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// TestAForgedFanOutIsIgnored: a worker running a task of tenant t2 sends
// a SubagentFanOut naming the fan_out call of a task of tenant t1's run,
// whose child is running. The orchestrator's login could resolve that
// call; it must not: the forged message is dropped, and t1's call is
// answered by its own child, once.
func TestAForgedFanOutIsIgnored(t *testing.T) {
	// Not parallel: trees of runs on workers with sims that take their
	// time; beside the package's timing-sensitive tests they starved them.
	b := setup(t)
	sim := llm.SimConfig{Latency: 200 * time.Millisecond, ToolCallsPerIteration: 1, FinishAfter: 6}
	w1, _ := b.worker(t, "w1", sim, 16)
	w2, _ := b.worker(t, "w2", sim, 16)
	victimKey := make(chan string, 1)
	forged := make(chan struct{})
	bad := forging(t, w2, func(f *fanoutv1.SubagentFanOut) {
		select {
		case key := <-victimKey:
			f.Key, f.Tasks = key, nil // another tenant's call, and a call the orchestrator would refuse
			close(forged)
		default:
		}
	})
	o1 := b.orchestrator(t, "o1", orchestrator.Config{}, w1)
	o2 := b.orchestrator(t, "o2", orchestrator.Config{}, bad)

	v := spec("victim", 1, 400_000)
	v.FanOut = &fanoutv1.FanOut{MaxDepth: 1}
	v.Tasks[0].Instruction = "study fan out(part a | part b)"
	v.Tasks[0].AllowedTools = []string{"search"} // its child's tasks search for a while
	started, err := o1.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: v})
	if err != nil {
		t.Fatal(err)
	}
	victim := started.GetRunId()
	var key string
	deadline := time.Now().Add(patience)
	for key == "" {
		err := b.pool.QueryRow(t.Context(), `SELECT key FROM tool_call WHERE run_id = $1 AND tool = 'fan_out'`, victim).Scan(&key)
		if err != nil && time.Now().After(deadline) {
			t.Fatalf("the victim's fan_out call was not recorded within %v: %v", patience, err)
		}
		time.Sleep(20 * time.Millisecond) // polling the table
	}
	victimKey <- key

	a := spec("attacker", 1, 400_000)
	a.TenantId = "t2"
	a.FanOut = &fanoutv1.FanOut{MaxDepth: 1}
	a.Tasks[0].Instruction = "fan out(anything)"
	a.Limits = &fanoutv1.Limits{RunTimeout: durationpb.New(3 * time.Second)}
	ctx, cancel := context.WithTimeout(tenantCtx(t, "t2"), patience)
	defer cancel()
	resp, err := o2.client.StartRun(ctx, &fanoutv1.StartRunRequest{Spec: a})
	if err != nil {
		t.Fatal(err)
	}
	await(t, forged, "the attacker's worker forged a fan_out")
	// The attacker's run ends (its own call is never answered).
	st, err := o2.client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: resp.GetRunId()})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := st.Recv(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("watch the attacker's run: %v", err)
			}
			break
		}
	}

	evs := watchAll(t, o1.client, victim)
	fin := evs[len(evs)-1].GetRunFinished()
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("the victim ended %s (%q)", fin.GetState(), fin.GetCancelCause())
	}
	var state, result, errText string
	if err := b.pool.QueryRow(t.Context(), `SELECT state, result, error FROM tool_call WHERE key = $1`, key).
		Scan(&state, &result, &errText); err != nil {
		t.Fatal(err)
	}
	if state != "done" || errText != "" || len(result) == 0 {
		t.Errorf("the victim's fan_out call is %s (%q): want done, answered by its own child", state, errText)
	}
	var children int
	if err := b.pool.QueryRow(t.Context(), `SELECT count(*) FROM run WHERE parent_run_id = $1`, victim).Scan(&children); err != nil {
		t.Fatal(err)
	}
	if children != 1 {
		t.Errorf("the victim has %d child runs, want 1", children)
	}
}
