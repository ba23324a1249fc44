package orchestrator

import (
	"context"
	"testing"
	"time"
)

// TestAwaitLeaseHonoursLost: once the heartbeat has reported the run
// taken (ar.lose), the engine's leases still "hold" (that very heartbeat
// succeeded), so awaitLease never looks at ar.lost and lets a new attempt
// begin. Synthesis runs on a context lose() does not cancel, so its
// retries go on beginning attempts on the run account the adopter uses.
func TestAwaitLeaseHonoursLost(t *testing.T) {
	e := &Engine{cfg: Config{OrphanAfter: time.Hour, HeartbeatInterval: time.Millisecond}, born: time.Now()}
	e.leaseFrom.Store(int64(time.Since(e.born))) // a heartbeat just succeeded (and said the run is lost)
	ar := newActiveRun(func(error) {})
	ar.lose()
	d := &driver{e: e, ar: ar, runID: "r"}
	if err := d.awaitLease(context.Background()); err == nil {
		t.Errorf("awaitLease returned nil for a run another replica took: the lost driver may begin an attempt")
	}
}
