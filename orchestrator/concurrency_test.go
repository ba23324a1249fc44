package orchestrator_test

import (
	"errors"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent/llm"
)

// The tests of docs/operations.md, "Concurrency from the rate limits": a
// run that leaves limits.max_concurrency unset runs as many tasks at once
// as the limits the providers stated (written here as a worker learns
// them) allow by Little's law, shares them with the other runs on them,
// halves on new 429s and creeps back up, and says why in its events.

// sizedConfig recomputes every 100 ms, so that a run of a few seconds sees
// several reads.
var sizedConfig = orchestrator.Config{ConcurrencyInterval: 100 * time.Millisecond}

// learnLimit writes what a worker would learn of the sim's limits: rpm
// requests per minute on one key, and throttled 429s more.
func (b *testBundle) learnLimit(t *testing.T, rpm, throttled int64) {
	t.Helper()
	if err := store.NewProviderLimits(b.pool).Learn(t.Context(), store.ProviderLimit{Bucket: "sim:k1", Provider: "sim",
		Model: "sim", ModelDefault: true, LimitRequests: rpm, Throttled: throttled}); err != nil {
		t.Fatal(err)
	}
}

// chosen are a run's ConcurrencyChosen events, in order.
func chosen(evs []*fanoutv1.RunEvent) []*fanoutv1.ConcurrencyChosen {
	var out []*fanoutv1.ConcurrencyChosen
	for _, ev := range evs {
		if c := ev.GetConcurrencyChosen(); c != nil {
			out = append(out, c)
		}
	}
	return out
}

// arithmetic is the rule's figure from an event's own inputs: the run's
// share of the requests per minute × headroom ÷ 60 × seconds per call,
// under the task count and any 429 cap, never below 1.
func arithmetic(c *fanoutv1.ConcurrencyChosen, tasks int32) int32 {
	n := int32(math.Floor(float64(c.GetLimitRequests())*c.GetHeadroom()/60*c.GetSecondsPerCall() + 1e-9))
	if cp := c.GetThrottleCap(); cp > 0 {
		n = min(n, cp)
	}
	return max(1, min(n, tasks))
}

// checkChosen checks the events' bookkeeping: one per change (each
// differs from the one before and names it as previous), each the
// arithmetic of its inputs, with a reason; none shows the fleet's runs
// sharing the limit or its 429s (other tenants' activity).
func checkChosen(t *testing.T, cs []*fanoutv1.ConcurrencyChosen, tasks int32) {
	t.Helper()
	if len(cs) == 0 {
		t.Fatal("the run has no ConcurrencyChosen event")
	}
	var previous int32
	for i, c := range cs {
		if c.GetPrevious() != previous || c.GetConcurrency() == previous {
			t.Errorf("event %d chose %d after %d, naming %d as previous: want one event per change", i, c.GetConcurrency(), previous, c.GetPrevious())
		}
		if want := arithmetic(c, tasks); c.GetConcurrency() != want {
			t.Errorf("event %d chose %d from %+v; the rule gives %d", i, c.GetConcurrency(), c, want)
		}
		if !strings.Contains(c.GetReason(), "RPM × 0.7 ÷ 60 s") {
			t.Errorf("event %d's reason %q does not show the arithmetic", i, c.GetReason())
		}
		if c.GetRunsSharing() != 0 || c.GetThrottled() != 0 || strings.Contains(c.GetReason(), "runs") {
			t.Errorf("event %d shows the fleet's figures: %d runs sharing, %d 429s, %q", i, c.GetRunsSharing(), c.GetThrottled(), c.GetReason())
		}
		t.Logf("chosen %d: %s", c.GetConcurrency(), c.GetReason())
		previous = c.GetConcurrency()
	}
}

func start(t *testing.T, n *node, s *fanoutv1.RunSpec) string {
	t.Helper()
	resp, err := n.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetRunId()
}

// TestConcurrencyFromALearnedLimit: under a learned 600 RPM, a run that
// leaves its concurrency unset starts with 600 × 0.7 ÷ 60 × 2 s per call
// (the starting point) = 14 tasks at once, and each change after is the
// rule applied to what the run observed; no more than 14 calls are ever
// open at once.
func TestConcurrencyFromALearnedLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.learnLimit(t, 600, 0)
	w, sim := b.worker(t, "w", llm.SimConfig{Latency: 300 * time.Millisecond, FinishAfter: 1}, 64)
	n := b.orchestrator(t, "o", sizedConfig, w)
	s := spec("sized", 20, 1_000_000)
	id := start(t, n, s)
	evs := watchAll(t, n.client, id)
	if fin := checkEvents(t, evs); fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("run ended %s", fin.GetState())
	}
	cs := chosen(evs)
	checkChosen(t, cs, 20)
	first := cs[0]
	if first.GetConcurrency() != 14 || first.GetLimitRequests() != 600 || first.GetHeadroom() != 0.7 ||
		first.GetSecondsPerCall() != 2 || first.GetObservedCalls() != 0 {
		t.Errorf("first choice %+v; want 14 = 600 RPM (the run alone: its share is all of it) × 0.7 ÷ 60 × 2 s per call (the starting point)", first)
	}
	if len(cs) < 2 || cs[len(cs)-1].GetObservedCalls() == 0 {
		t.Errorf("%d choices, the last observing %d calls: want the observed calls (0.3 s each) to change it", len(cs), cs[len(cs)-1].GetObservedCalls())
	}
	got, err := n.client.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: id})
	if err != nil {
		t.Fatal(err)
	}
	if c := got.GetRun().GetConcurrency(); c.GetConcurrency() != cs[len(cs)-1].GetConcurrency() || c.GetReason() != cs[len(cs)-1].GetReason() {
		t.Errorf("GetRun shows concurrency %+v; want the last chosen, %+v", c, cs[len(cs)-1])
	}
	if most := mostTasksAtOnce(sim.Calls()); most > 14 {
		t.Errorf("%d tasks had a call open at once; the run never allowed more than 14", most)
	}
}

// TestRunsSharingALimitEachGetAHalf: two runs on one limit each count the
// other and take half of what one alone would: their events show a share
// of 300 RPM, not the 600 nor that two runs share it.
func TestRunsSharingALimitEachGetAHalf(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.learnLimit(t, 600, 0)
	// 2 s per call: the observed figure stays near the starting point.
	w, _ := b.worker(t, "w", llm.SimConfig{Latency: 2 * time.Second, FinishAfter: 1}, 64)
	n := b.orchestrator(t, "o", sizedConfig, w)
	ids := []string{start(t, n, spec("share-a", 16, 1_000_000)), start(t, n, spec("share-b", 16, 1_000_000))}
	for i, id := range ids {
		cs := chosen(watchAll(t, n.client, id))
		checkChosen(t, cs, 16)
		var halves int
		for _, c := range cs {
			if c.GetLimitRequests() == 300 {
				halves++
				alone := math.Floor(600*c.GetHeadroom()/60*c.GetSecondsPerCall() + 1e-9)
				if got := float64(c.GetConcurrency()); got > alone/2 || got < alone/2-1 {
					t.Errorf("run %d: %d sharing with one other run; alone it would have %v: want half", i, c.GetConcurrency(), alone)
				}
			}
		}
		if halves == 0 {
			t.Errorf("run %d: no choice took half of the 600 RPM: %+v", i, cs)
		}
	}
}

// TestAStatedConcurrencyIsLeftAlone: a run that states its concurrency
// keeps it, whatever the limits say, and has no ConcurrencyChosen.
func TestAStatedConcurrencyIsLeftAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.learnLimit(t, 600, 0)
	// Calls of a second: the stated 3 overlap however busy the machine.
	w, sim := b.worker(t, "w", llm.SimConfig{Latency: time.Second, FinishAfter: 1}, 64)
	n := b.orchestrator(t, "o", sizedConfig, w)
	s := spec("stated", 6, 1_000_000)
	s.Limits = &fanoutv1.Limits{MaxConcurrency: 3}
	evs := watchAll(t, n.client, start(t, n, s))
	if cs := chosen(evs); len(cs) != 0 {
		t.Errorf("a run that states max_concurrency 3 had its concurrency chosen: %+v", cs)
	}
	if most := mostTasksAtOnce(sim.Calls()); most != 3 {
		t.Errorf("%d tasks had a call open at once, want the stated 3", most)
	}
}

// TestNoLimitKnownIsTheServersDefault: with nothing learned, the run runs
// at the server's default and its event says why.
func TestNoLimitKnownIsTheServersDefault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.worker(t, "w", llm.SimConfig{FinishAfter: 1}, 64)
	n := b.orchestrator(t, "o", orchestrator.Config{ConcurrencyInterval: 100 * time.Millisecond, DefaultConcurrency: 5}, w)
	cs := chosen(watchAll(t, n.client, start(t, n, spec("unknown-limit", 8, 1_000_000))))
	if len(cs) != 1 || cs[0].GetConcurrency() != 5 || !strings.Contains(cs[0].GetReason(), "no rate limit is known") {
		t.Errorf("choices %+v; want one: 5, the server's default, as no rate limit is known", cs)
	}
}

// TestA429GrowthHalvesItAndItCreepsBack: 429s counted between two reads
// halve the run's concurrency; each read after without a new one adds 1
// back until the arithmetic binds again.
func TestA429GrowthHalvesItAndItCreepsBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.learnLimit(t, 600, 0)
	w, _ := b.worker(t, "w", llm.SimConfig{Latency: 2 * time.Second, FinishAfter: 1}, 64)
	n := b.orchestrator(t, "o", sizedConfig, w)
	id := start(t, n, spec("throttled", 40, 1_000_000))
	stream, err := n.client.WatchRun(t.Context(), &fanoutv1.WatchRunRequest{RunId: id})
	if err != nil {
		t.Fatal(err)
	}
	var cs []*fanoutv1.ConcurrencyChosen
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if c := msg.GetEvent().GetConcurrencyChosen(); c != nil {
			if len(cs) == 0 { // the storm, once the run has chosen
				b.learnLimit(t, 600, 50)
			}
			cs = append(cs, c)
		}
	}
	checkChosen(t, cs, 40)
	halved := -1
	for i, c := range cs {
		if c.GetThrottleCap() > 0 {
			halved = i
			break
		}
	}
	if halved < 1 {
		t.Fatalf("no choice was held by the 429s after the first: %+v", cs)
	}
	if h := cs[halved]; h.GetConcurrency() != max(1, h.GetPrevious()/2) ||
		!strings.Contains(h.GetReason(), "after new 429s") || strings.Contains(h.GetReason(), "50") {
		t.Errorf("after 50 429s: %+v; want half of %d, the reason saying 429s held it (not the fleet's count)", h, h.GetPrevious())
	}
	// The cap rises by one a read. Only reads move it: a recompute after a
	// task ended (its calls' average changed the arithmetic) may choose
	// under the cap, and back up to it, at the same cap. So each choice the
	// cap binds is at the cap of the one before it bound, or one more.
	rest := cs[halved+1:]
	last := cs[halved].GetThrottleCap()
	for i, c := range rest {
		cp := c.GetThrottleCap()
		if cp == 0 || c.GetConcurrency() != cp {
			continue // the cap is gone, or does not bind
		}
		if cp != last && cp != last+1 {
			t.Errorf("creeping back, choice %d held to a cap of %d after %d: want one more a read", halved+1+i, cp, last)
		}
		last = cp
	}
	if len(rest) == 0 || rest[len(rest)-1].GetThrottleCap() != 0 {
		t.Errorf("the concurrency did not creep back to the arithmetic's: %+v", rest)
	}
}

// TestATenantsHeadroom: a tenant's headroom replaces the server's 0.7: at
// 0.5, 600 RPM × 0.5 ÷ 60 × 2 s per call = 10 tasks at once.
func TestATenantsHeadroom(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.learnLimit(t, 600, 0)
	if _, err := b.pool.Exec(t.Context(), `INSERT INTO tenant (tenant_id, headroom) VALUES ('t1', 0.5)`); err != nil {
		t.Fatal(err)
	}
	w, _ := b.worker(t, "w", llm.SimConfig{Latency: 2 * time.Second, FinishAfter: 1}, 64)
	n := b.orchestrator(t, "o", sizedConfig, w)
	cs := chosen(watchAll(t, n.client, start(t, n, spec("headroom", 12, 1_000_000))))
	if len(cs) == 0 || cs[0].GetConcurrency() != 10 || cs[0].GetHeadroom() != 0.5 ||
		!strings.Contains(cs[0].GetReason(), "600 RPM × 0.5 ÷ 60 s") {
		t.Errorf("choices %+v; want first 10 = 600 RPM × 0.5 ÷ 60 × 2 s per call", cs)
	}
}
