package budget_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/fanout/fanout/budget"
)

// TestLostNoticeIsHeardWithinThePollInterval measures docs/operations.md's
// bound "with LISTEN down, cancellation latency is at most the poll
// interval", with the default interval (1 s, --poll-interval's default):
// runs end with no notice at different moments of the poll's cycle, and
// each subscriber is told within the interval plus a margin of 250 ms for
// a loaded machine's scheduling. A poll of 1.3 s fails it.
func TestLostNoticeIsHeardWithinThePollInterval(t *testing.T) {
	const margin = 250 * time.Millisecond
	src := newSource()
	w := start(t, src, budget.WatcherConfig{})
	for i := range 4 {
		id := fmt.Sprintf("r%d", i)
		s := w.Subscribe(id)
		// After the first, each run ends i/4 of the interval after the
		// poll that told the last one: the worst case (just after a
		// poll) and three other phases of the cycle.
		time.Sleep(time.Duration(i) * budget.DefaultPollInterval / 4) // not synchronization: placing the end in the poll's cycle
		ended := time.Now()
		src.end(budget.RunSignal{RunID: id, State: budget.StateCancelled, Cause: "user"}) // no notice sent
		sig := waitDone(t, s)
		took := time.Since(ended)
		s.Close()
		if sig.State != budget.StateCancelled {
			t.Errorf("run %s: got %+v, want cancelled", id, sig)
		}
		t.Logf("run %s: heard %v after it ended", id, took)
		if took > budget.DefaultPollInterval+margin {
			t.Errorf("run %s ended with its notice lost was heard after %v; want within the poll interval %v (+%v)",
				id, took, budget.DefaultPollInterval, margin)
		}
	}
	if budget.DefaultPollInterval != time.Second {
		t.Errorf("DefaultPollInterval = %v; docs/operations.md and --poll-interval say 1s", budget.DefaultPollInterval)
	}
}
