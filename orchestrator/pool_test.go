package orchestrator_test

import (
	"testing"

	"google.golang.org/grpc/connectivity"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

type fakeConn connectivity.State

func (c *fakeConn) GetState() connectivity.State { return connectivity.State(*c) }

// TestPoolPrefersConnectedWorkers: a try goes to the first worker whose
// channel is READY, looking from the one in turn on, and to the one in turn
// (to wait for it) only when none is.
func TestPoolPrefersConnectedWorkers(t *testing.T) {
	t.Parallel()
	states := []*fakeConn{new(fakeConn), new(fakeConn), new(fakeConn)}
	var ws []orchestrator.Worker
	for i, c := range states {
		ws = append(ws, orchestrator.Worker{Addr: string(rune('a' + i)),
			Client: fanoutv1.NewSubagentServiceClient(nil), Conn: c})
	}
	pool, err := orchestrator.NewWorkerPool(ws...)
	if err != nil {
		t.Fatal(err)
	}
	set := func(s ...connectivity.State) {
		for i := range states {
			*states[i] = fakeConn(s[i])
		}
	}
	for _, tc := range []struct {
		name   string
		states []connectivity.State
		from   int
		want   string
		wantOK bool
	}{
		{"the one in turn is ready", []connectivity.State{connectivity.Ready, connectivity.Ready, connectivity.Ready}, 1, "b", true},
		{"the next ready one", []connectivity.State{connectivity.Ready, connectivity.TransientFailure, connectivity.Connecting}, 1, "a", true},
		{"wraps around in pool order", []connectivity.State{connectivity.TransientFailure, connectivity.Ready, connectivity.Ready}, 2, "c", true},
		{"skips the one in turn", []connectivity.State{connectivity.TransientFailure, connectivity.Ready, connectivity.Ready}, 0, "b", true},
		{"none ready: the one in turn", []connectivity.State{connectivity.TransientFailure, connectivity.Connecting, connectivity.Idle}, 1, "b", false},
	} {
		set(tc.states...)
		got, ok := pool.Connected(ws[tc.from])
		if got.Addr != tc.want || ok != tc.wantOK {
			t.Errorf("%s: Connected(%s) = %s, %v; want %s, %v", tc.name, ws[tc.from].Addr, got.Addr, ok, tc.want, tc.wantOK)
		}
	}
}
