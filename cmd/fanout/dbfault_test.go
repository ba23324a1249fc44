//go:build failover

package main

// Partitions between the fleet and PostgreSQL, and a slow, lossy network to
// it (issue 48, item 2): an orchestrator cut off the database but not its
// workers, a worker and an orchestrator cut off for longer than a lease and
// healed, and every node's connections 200 ms away with loss. Each ends
// with every run ended, every task finished once, every write sent at most
// once, the ledger conserved with nothing held, and the time to serve again
// logged against the bound the flags give (docs/operations.md#failure-modes-and-what-happens).
// `make failover` runs them (build tag failover).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent/mcp"
)

// The fault fleet's timing, short so that each test ends in well under a
// minute and a half on a loaded 2-core machine.
const (
	faultHeartbeat   = 200 * time.Millisecond // --heartbeat-interval
	faultOrphanAfter = 2 * time.Second        // --orphan-after
	faultLeaseTTL    = 4 * time.Second        // workers' --lease-ttl
	faultSweep       = 200 * time.Millisecond // --sweep-interval (e2eSweep)
	// faultSlack is what a loaded machine may add to a bound: statements
	// queued behind others, a process descheduled.
	faultSlack = 3 * time.Second
)

// faultOrchFlags are every fault-test orchestrator's flags.
var faultOrchFlags = []string{"--heartbeat-interval", faultHeartbeat.String(), "--orphan-after", faultOrphanAfter.String(),
	"--poll-interval", e2ePoll, "--sweep-interval", e2eSweep}

// adoptBound is how long after an orchestrator's last heartbeat another
// replica adopts its run: the heartbeat must be --orphan-after stale
// (database time), and the adopter looks once per --heartbeat-interval
// (orchestrator/lease.go: beat, adoptOrphans). The last heartbeat
// preceded the cut by up to one interval, which the bound does not
// subtract.
const adoptBound = faultOrphanAfter + faultHeartbeat

// resumeBound is how long after the cut the adopter resumes the run
// (RunAdopted): adoption, then the wait for the fenced attempts'
// reservations to end (orchestrator/resume.go: awaitHeld), which a worker
// that reaches the database ends when its call returns and, at worst, the
// sweeper posts a lease's end + --sweep-interval after its last renewal.
const resumeBound = adoptBound + faultLeaseTTL + faultSweep

// faultFleet is two workers and two orchestrators over one database, with
// server-memory's create_entities (a write) and search_nodes (a read)
// behind the recording shim.
type faultFleet struct {
	url, cfg, shimDir string
	pool              *store.Pool
	wflags            []string
}

func newFaultFleet(t *testing.T, simLatency string) *faultFleet {
	t.Helper()
	f := &faultFleet{url: storetest.NewDB(t)}
	f.pool = openPool(t, f.url)
	f.cfg, f.shimDir, _ = memoryServerConfig(t, []any{
		map[string]any{"name": "create_entities", "effect": "write"},
		map[string]any{"name": "search_nodes", "effect": "read"},
	})
	// Each reply but the answer calls a write and a read: two replies make
	// two writes a task.
	f.wflags = []string{"--mcp-config", f.cfg, "--sim-latency", simLatency, "--sim-tool-calls", "2",
		"--sim-finish-after", "3", "--lease-ttl", faultLeaseTTL.String(),
		"--poll-interval", e2ePoll, "--sweep-interval", e2eSweep}
	return f
}

// spec is a run of n tasks that each write and read.
func (f *faultFleet) spec(key string, n int) *fanoutv1.RunSpec {
	s := e2eSpec(key, n, 5_000_000)
	s.Limits.MaxConcurrency = int32(n)
	for _, task := range s.GetTasks() {
		task.AllowedTools = []string{mcp.ModelName("memory", "create_entities"), mcp.ModelName("memory", "search_nodes")}
	}
	return s
}

// heldCount is how many of the run's reservations are held.
func heldCount(t testing.TB, pool *store.Pool, runID string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM reservation WHERE run_id = $1 AND state = 'held'`,
		runID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// adoptionTimes watches a run through c in the background and records when
// this process saw it adopted and saw the first task start after that.
type adoptionTimes struct {
	mu                 sync.Mutex
	adopted, restarted time.Time
}

func (a *adoptionTimes) see(ev *fanoutv1.RunEvent) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case ev.GetRunAdopted() != nil && a.adopted.IsZero():
		a.adopted = time.Now()
	case ev.GetTaskStarted() != nil && !a.adopted.IsZero() && a.restarted.IsZero():
		a.restarted = time.Now()
	}
}

func (a *adoptionTimes) get() (adopted, restarted time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.adopted, a.restarted
}

// since is d's time after from, or "never" for a zero time.
func since(from, at time.Time) string {
	if at.IsZero() {
		return "never"
	}
	return at.Sub(from).Round(time.Millisecond).String()
}

// checkRunEnd checks what every fault test claims of a run that ended with
// evs: a final state with every task's outcome, one TaskFinished per task
// in the database, the ledger conserved with nothing held, no two attempts
// of a task holding grants at once, and each write sent at most once. It
// returns the outcomes by status and the writes the server got.
func (f *faultFleet) checkRunEnd(t *testing.T, s *fanoutv1.RunSpec, runID string, evs []*fanoutv1.RunEvent) (map[string]int, int) {
	t.Helper()
	fin := evs[len(evs)-1].GetRunFinished()
	if st := fin.GetState(); st == fanoutv1.RunState_RUN_STATE_UNSPECIFIED || st == fanoutv1.RunState_RUN_STATE_RUNNING {
		t.Errorf("run ended in state %s, not a final one", st)
	}
	checkOutcomes(t, s, fin.GetResult().GetTasks())
	statuses := map[string]int{}
	for _, o := range fin.GetResult().GetTasks() {
		statuses[o.GetStatus().String()]++
	}
	ctx := context.Background()
	var finished, tasks int
	if err := f.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event->'task_finished'->'outcome'->>'task_id')
		FROM run_event WHERE run_id = $1 AND event ? 'task_finished'`, runID).Scan(&finished, &tasks); err != nil {
		t.Fatal(err)
	}
	if finished != len(s.GetTasks()) || tasks != len(s.GetTasks()) {
		t.Errorf("%d TaskFinished events of %d tasks, want one for each of the %d", finished, tasks, len(s.GetTasks()))
	}
	waitClosed(t, f.pool, runID)
	checkConserved(t, f.pool, runID)
	if n := heldCount(t, f.pool, runID); n != 0 {
		t.Errorf("%d reservations of the run are still held after it closed", n)
	}
	storetest.CheckAttemptsApart(t, f.pool, runID)
	return statuses, f.checkWritesAtMostOnce(t, runID)
}

// checkWritesAtMostOnce checks that no write of the run reached the server
// twice: not under one idempotency key, and not as the same call (tool and
// arguments) of one task under two keys (a later attempt replays what an
// earlier one sent). It returns how many writes the server got.
func (f *faultFleet) checkWritesAtMostOnce(t *testing.T, runID string) int {
	t.Helper()
	byKey, byCall := map[string]int{}, map[string][]string{}
	n := 0
	for _, r := range readShimRecords(t, f.shimDir) {
		key, _ := r.Meta[mcp.MetaIdempotencyKey].(string)
		if r.Kind != "request" || r.Tool != "create_entities" || len(key) <= len(runID) || key[:len(runID)+1] != runID+"/" {
			continue
		}
		n++
		byKey[key]++
		call := canonicalDigest(t, r.Arguments)
		byCall[call] = append(byCall[call], key)
	}
	for key, c := range byKey {
		if c != 1 {
			t.Errorf("write %s reached the server %d times, want at most once", key, c)
		}
	}
	for call, keys := range byCall {
		if len(keys) != 1 {
			t.Errorf("the write with arguments digest %s reached the server %d times, under keys %v", call, len(keys), keys)
		}
	}
	return n
}

// TestOrchestratorCutOffFromPostgres: orchestrator o1 reaches Postgres only
// through a proxy, o2 and both workers directly. o1 drives a run of 6
// tasks (1 s model calls, two writes each) and is cut off while every task
// has a call in flight on a worker: the workers still reach o1 and the
// database. o2 adopts the run once o1's heartbeat is --orphan-after stale
// and finishes it; o1, whose lease no longer holds by its own clock,
// dispatches nothing more, and its attempts, fenced by o2's, reserve
// nothing more: no two attempts of a task hold grants at once. Reset: o1's
// connections are reset and new ones refused. BlackHoled: they hang.
func TestOrchestratorCutOffFromPostgres(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode proxyMode
	}{{"Reset", reset}, {"BlackHoled", blackHoled}} {
		t.Run(tc.name, func(t *testing.T) {
			testOrchestratorCutOff(t, tc.mode)
		})
	}
}

func testOrchestratorCutOff(t *testing.T, mode proxyMode) {
	f := newFaultFleet(t, "1s")
	o1URL, proxy := proxiedURL(t, f.url)
	workers := []*workerProc{startWorkerProc(t, f.url, "w1", f.wflags...), startWorkerProc(t, f.url, "w2", f.wflags...)}
	oflags := append([]string{"--mcp-config", f.cfg}, faultOrchFlags...)
	o1 := startOrchestratorProc(t, o1URL, "o1", workers, oflags...)
	o2 := startOrchestratorMain(t, f.url, workers, append([]string{"--name", "o2"}, oflags...)...)

	const tasks = 6
	s := f.spec("orchestrator-cut-"+t.Name(), tasks)
	started, err := dial(t, o1.addr).StartRun(context.Background(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := started.GetRunId()
	waitFor(t, 30*time.Second, "every task started, with calls in flight", func() (bool, string) {
		st, held := tasksStarted(t, f.pool, runID), heldCount(t, f.pool, runID)
		return st == tasks && held >= tasks/2, fmt.Sprintf("%d started, %d reservations held", st, held)
	})
	done := tasksIn(t, f.pool, runID, "SUCCEEDED")
	proxy.cut(mode)
	cut := time.Now()
	if done > 0 {
		t.Fatalf("%d of %d tasks were done at the cut: the run does not span it", done, tasks)
	}

	var at adoptionTimes
	evs := watchAll(t, o2.client, runID, at.see)
	ended := time.Now()
	adopted, restarted := at.get()
	var adoptions []*fanoutv1.RunAdopted
	for _, ev := range evs {
		if a := ev.GetRunAdopted(); a != nil {
			adoptions = append(adoptions, a)
		}
	}
	if len(adoptions) != 1 || adoptions[0].GetPreviousOwner() != "o1" || adoptions[0].GetOwner() != "o2" {
		t.Errorf("RunAdopted events %v, want one, from o1 to o2", adoptions)
	}
	statuses, writes := f.checkRunEnd(t, s, runID, evs)
	if fin := evs[len(evs)-1].GetRunFinished(); fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Errorf("run ended %s (%q), want SUCCEEDED: o2 resumes every task", fin.GetState(), fin.GetCancelCause())
	}
	checkAllSucceeded(t, evs[len(evs)-1].GetRunFinished())
	t.Logf("cut (%s) with %d tasks running: resumed on o2 (RunAdopted) %s after (bound orphan-after + heartbeat-interval "+
		"+ lease-ttl + sweep-interval = %v), first task restarted %s after, run ended %s after; outcomes %v, %d writes sent",
		map[proxyMode]string{reset: "reset", blackHoled: "black-holed"}[mode], tasks, since(cut, adopted), resumeBound,
		since(cut, restarted), since(cut, ended), statuses, writes)
	if adopted.IsZero() || adopted.Sub(cut) > resumeBound+faultSlack {
		t.Errorf("the run was resumed on o2 %s after the cut, want within %v (+%v slack)", since(cut, adopted), resumeBound, faultSlack)
	}

	// o1 comes back: it finds its run taken and abandons it, writing
	// nothing more; then it stops as any replica does.
	before := eventCount(t, f.pool, runID)
	proxy.heal(t)
	waitFor(t, 20*time.Second, "o1, healed, abandoning the run o2 adopted", func() (bool, string) {
		return strings.Contains(o1.logs.all(), `"msg":"another orchestrator adopted a run this one drives`), "no such log line on o1"
	})
	if after := eventCount(t, f.pool, runID); after != before {
		t.Errorf("the run has %d events after o1 came back, %d when it ended", after, before)
	}
}

// checkAllSucceeded checks that every task of the run succeeded: a run
// whose tasks all failed still ends SUCCEEDED (it completed).
func checkAllSucceeded(t *testing.T, fin *fanoutv1.RunFinished) {
	t.Helper()
	for _, o := range fin.GetResult().GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			t.Errorf("task %s ended %s (%s), want SUCCEEDED", o.GetTaskId(), o.GetStatus(), o.GetSummary().GetError())
		}
	}
}

// eventCount is how many events the run has in the database.
func eventCount(t testing.TB, pool *store.Pool, runID string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM run_event WHERE run_id = $1`, runID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFleetCutOffLongerThanALease: a worker (w1) and an orchestrator (o1)
// each reach Postgres through a proxy; o2 and w2 directly. o1 drives a run
// of 6 tasks on both workers; both proxies are black-holed for twice the
// workers' lease TTL, then healed. w1's calls stop before their leases end
// and the sweeper posts them; o2 adopts the run, fences o1's attempts and
// finishes it. After the heal, o1 abandons the run, and a new run through
// o1 succeeds: the time from the heal to that is "time to serve again".
func TestFleetCutOffLongerThanALease(t *testing.T) {
	f := newFaultFleet(t, "1s")
	w1URL, pw := proxiedURL(t, f.url)
	o1URL, po := proxiedURL(t, f.url)
	workers := []*workerProc{startWorkerProc(t, w1URL, "w1", f.wflags...), startWorkerProc(t, f.url, "w2", f.wflags...)}
	oflags := append([]string{"--mcp-config", f.cfg}, faultOrchFlags...)
	o1 := startOrchestratorProc(t, o1URL, "o1", workers, oflags...)
	o2 := startOrchestratorMain(t, f.url, workers, append([]string{"--name", "o2"}, oflags...)...)
	c1 := dial(t, o1.addr)
	waitFleetConnected(t, c1, 2) // the claim needs tasks on the cut-off worker too

	const tasks = 6
	s := f.spec("fleet-cut", tasks)
	started, err := c1.StartRun(context.Background(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := started.GetRunId()
	waitFor(t, 30*time.Second, "every task started, with calls in flight", func() (bool, string) {
		st, held := tasksStarted(t, f.pool, runID), heldCount(t, f.pool, runID)
		return st == tasks && held >= tasks/2, fmt.Sprintf("%d started, %d reservations held", st, held)
	})
	pw.cut(blackHoled)
	po.cut(blackHoled)
	cut := time.Now()
	watched := make(chan []*fanoutv1.RunEvent, 1)
	var at adoptionTimes
	go func() {
		watched <- watchRun(o2.client, runID, at.see)
	}()
	const cutFor = 2 * faultLeaseTTL
	waitFor(t, cutFor+faultSlack, "the cut lasting twice the lease TTL", func() (bool, string) {
		return time.Since(cut) >= cutFor, since(cut, time.Now()) + " so far"
	})
	pw.heal(t)
	po.heal(t)
	healed := time.Now()

	// Time to serve again: a new run through the healed orchestrator.
	served := serveAgain(t, c1, "fleet-cut-after", 4, healed.Add(60*time.Second))
	t.Logf("after the heal, a new 4-task run through o1 succeeded in %v (its tasks on %v)",
		served.took.Round(time.Millisecond), served.workers)

	var evs []*fanoutv1.RunEvent
	select {
	case evs = <-watched:
	case <-time.After(60 * time.Second):
		t.Fatal("the cut run did not end within 60 s of the heal")
	}
	if evs == nil {
		t.Fatal("the watch of the cut run ended without RunFinished (see above)")
	}
	ended := time.Now()
	adopted, restarted := at.get()
	statuses, writes := f.checkRunEnd(t, s, runID, evs)
	t.Logf("cut (black-holed) w1 and o1 for %v with %d tasks running: resumed on o2 %s after "+
		"(bound %v), first task restarted %s after, run ended %s after the cut (%s after the heal); outcomes %v, %d writes sent",
		cutFor, tasks, since(cut, adopted), resumeBound, since(cut, restarted), since(cut, ended), since(healed, ended),
		statuses, writes)
	if adopted.IsZero() || adopted.Sub(cut) > resumeBound+faultSlack {
		t.Errorf("the run was resumed on o2 %s after the cut, want within %v (+%v slack)", since(cut, adopted), resumeBound, faultSlack)
	}
}

// served is how a run after a fault went: how long from the heal until it
// succeeded, and which workers ran its tasks.
type served struct {
	took    time.Duration
	workers map[string]int
}

// serveAgain runs n tool-less tasks through c, again and again until one
// run succeeds or deadline passes, and says how long that took.
func serveAgain(t *testing.T, c fanoutv1.OrchestratorServiceClient, key string, n int, deadline time.Time) served {
	t.Helper()
	from := time.Now()
	for i := 0; ; i++ {
		s := e2eSpec(fmt.Sprintf("%s-%d", key, i), n, 1_000_000)
		for _, task := range s.GetTasks() {
			task.AllowedTools = nil
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		evs, err := runEvents(ctx, c, s)
		cancel()
		if err == nil {
			fin := evs[len(evs)-1].GetRunFinished()
			if fin.GetState() == fanoutv1.RunState_RUN_STATE_SUCCEEDED {
				ws := map[string]int{}
				for _, o := range fin.GetResult().GetTasks() {
					ws[o.GetWorker()]++
				}
				return served{took: time.Since(from), workers: ws}
			}
			err = fmt.Errorf("run ended %s (%s)", fin.GetState(), fin.GetCancelCause())
		}
		if time.Now().After(deadline) {
			t.Fatalf("no run succeeded through the healed orchestrator in %v (%d tries); the last: %v", time.Since(from), i+1, err)
		}
		time.Sleep(200 * time.Millisecond) // a retry's pause, not synchronization
	}
}

// runEvents calls Run and returns every event, or the error that ended
// the stream early.
func runEvents(ctx context.Context, c fanoutv1.OrchestratorServiceClient, s *fanoutv1.RunSpec) ([]*fanoutv1.RunEvent, error) {
	stream, err := c.Run(ctx, &fanoutv1.RunRequest{Spec: s})
	if err != nil {
		return nil, err
	}
	var evs []*fanoutv1.RunEvent
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return evs, err
		}
		evs = append(evs, m.GetEvent())
	}
	if len(evs) == 0 || evs[len(evs)-1].GetRunFinished() == nil {
		return evs, fmt.Errorf("the stream ended after %d events without RunFinished", len(evs))
	}
	return evs, nil
}

// watchRun is watchAll for a goroutine: nil if the stream ended without
// RunFinished or failed, after saying so on stderr.
func watchRun(c fanoutv1.OrchestratorServiceClient, runID string, each func(*fanoutv1.RunEvent)) []*fanoutv1.RunEvent {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	stream, err := c.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID})
	if err != nil {
		fmt.Fprintf(os.Stderr, "watch %s: %v\n", runID, err)
		return nil
	}
	var evs []*fanoutv1.RunEvent
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "watch %s: %v after %d events\n", runID, err, len(evs))
			return nil
		}
		each(m.GetEvent())
		evs = append(evs, m.GetEvent())
	}
	if len(evs) == 0 || evs[len(evs)-1].GetRunFinished() == nil {
		fmt.Fprintf(os.Stderr, "watch %s: ended after %d events without RunFinished\n", runID, len(evs))
		return nil
	}
	return evs
}

// dbLatency is what TestDatabaseLatencyAndLoss puts between every node and
// Postgres: 200 ms one way, and one chunk in 20 "lost", held back a
// retransmission timeout of 200 ms to 1 s more.
var dbLatency = latency{delay: 200 * time.Millisecond, loss: 0.05, minRTO: 200 * time.Millisecond, maxRTO: time.Second}

// TestDatabaseLatencyAndLoss: an orchestrator and two workers, each
// reaching Postgres through a proxy of its own, run the same 8-task run
// (a write and a read per reply) twice: first with the proxies forwarding
// at once, then with dbLatency on every connection. Both runs succeed with
// every task once, every write sent at most once, the ledger conserved and
// nothing held; their durations are logged. (netem is not available here:
// the kernel has no sch_netem, so the latency is the proxies' delay line.)
func TestDatabaseLatencyAndLoss(t *testing.T) {
	f := newFaultFleet(t, "200ms")
	var proxies []*tcpProxy
	proxied := func() string {
		u, p := proxiedURL(t, f.url)
		proxies = append(proxies, p)
		return u
	}
	// Default leases (30 s) and run leases: a round trip of 400 ms or more,
	// with a lost chunk's second, must not end a lease by itself.
	wflags := append(f.wflags[:len(f.wflags):len(f.wflags)], "--lease-ttl", "30s")
	workers := []*workerProc{startWorkerProc(t, proxied(), "w1", wflags...), startWorkerProc(t, proxied(), "w2", wflags...)}
	o := startOrchestratorMain(t, proxied(), workers, "--mcp-config", f.cfg, "--poll-interval", e2ePoll, "--sweep-interval", e2eSweep)

	const tasks = 8
	run := func(key string, limit time.Duration) time.Duration {
		s := f.spec(key, tasks)
		begun := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		defer cancel()
		evs, err := runEvents(ctx, o.client, s)
		if err != nil {
			t.Fatalf("run %s: %v after %v", key, err, time.Since(begun))
		}
		took := time.Since(begun)
		fin := evs[len(evs)-1].GetRunFinished()
		if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
			t.Errorf("run %s ended %s (%q), want SUCCEEDED", key, fin.GetState(), fin.GetCancelCause())
		}
		statuses, writes := f.checkRunEnd(t, s, evs[0].GetRunId(), evs)
		checkAllSucceeded(t, fin)
		var first, mean, last time.Duration
		if err := f.pool.QueryRow(context.Background(), `SELECT min(t.started_at) - min(r.created_at),
			avg(t.finished_at - t.started_at), max(t.finished_at) - min(r.created_at)
			FROM task t JOIN run r USING (run_id) WHERE run_id = $1`, evs[0].GetRunId()).Scan(&first, &mean, &last); err != nil {
			t.Fatal(err)
		}
		t.Logf("run %s: %v; first task started %v after the run was created, a task took %v on average, the last ended at %v; "+
			"outcomes %v, %d writes sent", key, took.Round(time.Millisecond), first.Round(time.Millisecond),
			mean.Round(time.Millisecond), last.Round(time.Millisecond), statuses, writes)
		return took
	}
	base := run("latency-base", 30*time.Second)
	for _, p := range proxies {
		p.setLatency(dbLatency)
		p.drop() // every connection from now on, not only new ones, at the new latency
	}
	slow := run("latency-slow", 75*time.Second)
	t.Logf("the same %d-task run took %v with Postgres at once and %v at %v one way with %.0f%% of chunks held back %v-%v more",
		tasks, base.Round(time.Millisecond), slow.Round(time.Millisecond), dbLatency.delay, dbLatency.loss*100,
		dbLatency.minRTO, dbLatency.maxRTO)
}
