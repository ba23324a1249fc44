package store_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store"
)

// TestIssueWriteSupersededAfterALostReplyLeavesNoIssuedRow (review of
// issue 13's fixes): an issue whose first try committed but whose reply
// was lost, and whose retry finds the attempt superseded (the orchestrator
// began attempt 2 in between), returns ErrAttemptSuperseded — so the
// subagent neither sends the write nor resolves its row — yet the first
// try's row stays issued for good. Attempt 2, which read the task's writes
// after it began, takes it for a write that was sent and cut off ("may
// have happened"), and no attempt ever makes it, though it never reached
// the tool; the auditor's view shows it issued forever.
func TestIssueWriteSupersededAfterALostReplyLeavesNoIssuedRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ts := openTasks(t, b)
	proxy, pool := newCutProxy(t, b.url)
	tc := store.NewToolCalls(pool, store.ToolCallsConfig{Logger: quiet})

	// The retry's execution, on a fresh connection: attempt 2 begins just
	// before it reaches the server (the first try has committed: its reply
	// was what the proxy dropped).
	var once sync.Once
	var began error
	fired := false
	beginAttempt2 := func(msg []byte) bool {
		if bind(msg) {
			once.Do(func() {
				fired = true
				_, began = b.ledger.BeginAttempt(b.ctx, ts["acme/r1/t1"], "r1", "acme")
			})
		}
		return false
	}
	armed := make(chan struct{})
	proxy.arm(func(msg []byte) bool {
		if !bind(msg) {
			return false
		}
		go func() { proxy.arm(beginAttempt2); close(armed) }() // once the proxy lets go of its lock
		return true
	})
	w := ts.at(write("r1/t1/a1/i0/c0", 1, 0, 0, `{"title":"a"}`))
	_, err := tc.IssueWrite(b.ctx, w, "")
	<-armed
	_ = proxy.cutCount() // takes the proxy's lock, which the predicates ran under
	if !fired {          // the proxy's lock orders this read after the predicate's writes
		t.Fatalf("IssueWrite: %v; no reply was lost and retried (the proxy cut nothing)", err)
	}
	if began != nil {
		t.Fatalf("begin attempt 2 between the tries: %v", began)
	}
	ws, werr := tc.Writes(b.ctx, "acme", "r1", "t1", "")
	if werr != nil {
		t.Fatal(werr)
	}
	if errors.Is(err, runs.ErrAttemptSuperseded) {
		for _, got := range ws {
			if got.Key == w.Key && got.State == runs.WriteIssued {
				t.Errorf("IssueWrite: %v, yet %s is recorded issued (state %s): a write that was never sent, "+
					"which every later attempt takes for one that may have happened", err, got.Key, got.State)
			}
		}
	} else if err != nil {
		t.Fatalf("IssueWrite whose reply was lost: %v", err)
	}
}
