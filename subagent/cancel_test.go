package subagent_test

import (
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

// TestServerCancelAfterExhaustionUnderDrain: under DRAIN a worker lets its
// call in flight run on when the run is exhausted, and stops it when the run
// is then cancelled in the ledger — heard through the watcher's second
// signal, not the stream, which stays open.
func TestServerCancelAfterExhaustionUnderDrain(t *testing.T) {
	t.Parallel()
	b := setup(t, 100_000, 50, map[string]int64{"a": 50_000})
	w := runWatcher(t, b)
	model := newGated(newSim(t, llm.SimConfig{}))
	client := serve(t, newServer(t, b, model, func(c *subagent.ServerConfig) { c.Watcher = w }))
	heard := w.Subscribe(b.runID) // the worker's subscription hears what this one hears
	defer heard.Close()

	req := request(b, "a")
	req.OnExhaustion = fanoutv1.ExhaustionPolicy_EXHAUSTION_POLICY_DRAIN
	stream, err := client.Execute(within(t), signed(req))
	if err != nil {
		t.Fatal(err)
	}
	waitStarted(t, model)

	// Another spender takes the rest of the run (a reservation on the run
	// account, attempt 1) and gives it back: the run is exhausted.
	acct, err := b.ledger.RunAccount(t.Context(), b.runID)
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.ledger.Reserve(t.Context(), budget.ReserveParams{Account: acct.ID, RunID: b.runID, TenantID: "t1",
		Attempt: 1, Want: acct.Available(), Min: 1, Holder: "test", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ledger.Void(t.Context(), res.ID, res.Lease.Generation, ""); err != nil {
		t.Fatal(err)
	}
	await(t, heard.Done(), "the watcher hearing the exhaustion")
	if sig := heard.Signal(); sig.State != budget.StateExhausted {
		t.Fatalf("the watcher heard %+v, want exhausted", sig)
	}
	time.Sleep(100 * time.Millisecond) // a worker that (wrongly) cancels on exhaustion under DRAIN has done so by now
	// The call's reservation came first; the test's own (voided) second.
	if call := b.reservations(t); len(call) != 2 || call[0].State != "held" {
		t.Fatalf("after the exhaustion under DRAIN the reservations are %+v; want the call's held, the call running", call)
	}

	if _, err := b.ledger.CancelRun(t.Context(), b.runID, "cancelled by caller: stop"); err != nil {
		t.Fatal(err)
	}
	poll(t, "the worker to cancel and settle its call after the exhausted run was cancelled", func() bool {
		return b.reservations(t)[0].State != "held"
	})
	msgs, err := collect(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	sum := msgs[len(msgs)-1].GetSummary()
	if sum.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_CANCELLED || sum.GetError() == "" {
		t.Errorf("summary %v, want CANCELLED with the cause", sum)
	}
	if res := b.reservations(t); !res[0].Estimated || res[0].State != "settled" {
		t.Errorf("reservations %+v, want the cancelled call settled at its reservation, estimated", res)
	}
	b.checkLedger(t)
}
