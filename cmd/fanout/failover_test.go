//go:build failover

package main

// The failover tier (issue 48; `make failover`; docs/operations.md#ha-postgresql):
// a primary and a standby on this machine, the fleet pointed at both through
// a multi-host URL with target_session_attrs=read-write, kill -9 of the
// primary under a load of fan-outs with tool writes and approvals, and
// the standby promoted.

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/pglocal"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent/mcp"
)

const (
	// failoverRuns runs of failoverTasks tasks each are in flight at the
	// kill; one more, failoverTight, has a budget that runs out.
	failoverRuns  = 5
	failoverTasks = 6
	// failoverLease is the workers' --lease-ttl: a grant the new primary
	// lacks is found out at the call's first renewal (TTL/3) or its settle.
	failoverLease = 6 * time.Second
	// failoverRunsEnd bounds how long after the kill the runs may take to
	// end by themselves (they end in about 6 s after a synchronous failover).
	failoverRunsEnd = 45 * time.Second
)

// closedTimer is a channel that is always ready.
var closedTimer = func() <-chan time.Time { c := make(chan time.Time); close(c); return c }()

// TestFailover: kill -9 of the primary under load, the standby promoted.
// Synchronous: nothing acknowledged is lost — every grant a worker was
// told of is in the new primary's ledger, every run ends, every task
// finishes once, every write is sent at most once, every account is
// conserved, no grant after exhaustion. Asynchronous (the standby's WAL
// receiver stopped for a moment before the kill, as a lagging network
// does): what the docs warn about — grants the workers were told of that
// the new primary never heard of — and what fanout does about them.
func TestFailover(t *testing.T) {
	t.Run("Synchronous", func(t *testing.T) { testFailover(t, true) })
	t.Run("Asynchronous", func(t *testing.T) { testFailover(t, false) })
}

// pgPair is a primary and its streaming standby.
type pgPair struct {
	primary, standby *pglocal.Server
	log              *lockedBuffer
}

// startPair starts a primary and a standby named s1, synchronous (the
// primary waits for s1's flush before it acknowledges a commit) or not, and
// creates database fanout, migrated, with the test logins, on it.
func startPair(t *testing.T, synchronous bool) (*pgPair, string) {
	t.Helper()
	// The logins of storetest.NodeURL and friends, made on the shared
	// server as those functions expect; the same ones are made below.
	shared := storetest.NewDB(t)
	storetest.NodeURL(t, shared)
	storetest.WorkerURL(t, shared)
	storetest.AdminURL(t, shared)
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := chmod711(d); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := &pgPair{log: &lockedBuffer{}}
	conf := ""
	if synchronous {
		conf = "synchronous_standby_names = 'FIRST 1 (s1)'"
	}
	var err error
	if p.primary, err = pglocal.Start(ctx, pglocal.Config{DataDir: filepath.Join(dir, "primary"), Log: p.log, Conf: conf}); err != nil {
		t.Fatalf("the failover tier runs its own PostgreSQL pair from the server binaries: %v", err)
	}
	t.Cleanup(func() { p.stop(t) })
	if p.standby, err = pglocal.StartStandby(ctx, p.primary, pglocal.Config{DataDir: filepath.Join(dir, "standby"), Log: p.log,
		Conf: "cluster_name = 's1'"}); err != nil {
		t.Fatal(err)
	}
	want := map[bool]string{true: "sync", false: "async"}[synchronous]
	admin := openPool(t, p.primary.URL("postgres"))
	waitFor(t, 30*time.Second, "standby s1 streaming, "+want, func() (bool, string) {
		var state, sync string
		err := admin.QueryRow(ctx, `SELECT coalesce(max(state), ''), coalesce(max(sync_state), '') FROM pg_stat_replication
			WHERE application_name = 's1'`).Scan(&state, &sync)
		if err != nil {
			t.Fatal(err)
		}
		return state == "streaming" && sync == want, state + " " + sync
	})
	if err := store.CreateDatabase(ctx, p.primary.URL("postgres"), "fanout"); err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx, p.primary.URL("fanout")); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	makeTestLogins(t, p.primary.URL("postgres"))
	return p, fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/fanout?sslmode=disable&target_session_attrs=read-write",
		p.primary.Port(), p.standby.Port())
}

func (p *pgPair) stop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, s := range []*pglocal.Server{p.standby, p.primary} {
		if s != nil {
			if err := s.Stop(ctx); err != nil {
				t.Errorf("stop: %v", err)
			}
		}
	}
	if t.Failed() {
		t.Logf("the pair's PostgreSQL log (tail):\n%s", tailLines(p.log.String(), 60))
	}
}

// walReceiver is the pid of the standby's WAL receiver.
func (p *pgPair) walReceiver(t *testing.T) int {
	t.Helper()
	pool := openPool(t, p.standby.URL("postgres"))
	defer pool.Close()
	var pid int
	if err := pool.QueryRow(context.Background(), `SELECT pid FROM pg_stat_wal_receiver`).Scan(&pid); err != nil {
		t.Fatalf("the standby's WAL receiver: %v", err)
	}
	return pid
}

func testFailover(t *testing.T, synchronous bool) {
	pair, ownerURL := startPair(t, synchronous)
	// doctor, on the owner's login (a superuser: it sees the standby's state).
	var out, errOut lockedBuffer
	code := Main(t.Context(), []string{"doctor", "--database-url", ownerURL}, &out, &errOut, func(string) string { return "" })
	t.Logf("fanout doctor (exit %d):\n%s", code, out.String())
	switch {
	case synchronous && (code != 0 || !strings.Contains(out.String(), "streaming from 127.0.0.1, sync,")):
		t.Errorf("doctor on a synchronous pair exited %d, want 0 and s1 sync:\n%s%s", code, out.String(), errOut.String())
	case !synchronous && (code != 1 || !strings.Contains(out.String(), "synchronous_standby_names is empty with 1 standby")):
		t.Errorf("doctor on an asynchronous pair exited %d, want 1 naming the asynchronous standby:\n%s%s", code, out.String(), errOut.String())
	}

	// The fleet. The servers check durability as in production (the
	// variable TestMain sets, emptied); on the asynchronous pair a worker is
	// refused first, then the fleet accepts asynchronous standbys
	// (--allow-async-standbys), and only them.
	env := []string{envUnsafeDurability + "="}
	var accept []string
	if !synchronous {
		var stdout, stderr lockedBuffer
		f := testPeer(t)
		code := Main(t.Context(), []string{"worker", "--listen", "127.0.0.1:0", "--metrics-listen", "",
			"--database-url", storetest.WorkerURL(t, ownerURL), "--peer-tls-ca", f.CA, "--peer-tls-cert", f.Worker.Cert,
			"--peer-tls-key", f.Worker.Key, "--peer-verify-keys", f.VerifyKey}, &stdout, &stderr, func(string) string { return "" })
		if code == 0 || !strings.Contains(stderr.String(), "synchronous_standby_names is empty") {
			t.Errorf("a worker on the asynchronous pair exited %d, want a refusal naming synchronous_standby_names:\n%s", code, stderr.String())
		}
		// Read replicas that are never promoted are what
		// --allow-async-standbys is for; the other checks stay on.
		accept = []string{"--allow-async-standbys"}
	}
	tool := mcp.ModelName("memory", "create_entities")
	cfg, shimDir, _ := memoryServerConfig(t, []any{map[string]any{"name": "create_entities", "effect": "write",
		"approval": "required", "approval_timeout": "2m"}})
	var workers []*workerProc
	for i := range 3 {
		workers = append(workers, startWorkerProcEnv(t, ownerURL, fmt.Sprintf("w%d", i+1), env,
			append([]string{"--mcp-config", cfg, "--sim-latency", "250ms", "--sim-tool-calls", "1", "--sim-finish-after", "3",
				"--lease-ttl", failoverLease.String(), "--poll-interval", e2ePoll, "--sweep-interval", e2eSweep}, accept...)...))
	}
	var orchs []*orchestratorProc
	procs := workers
	for _, name := range []string{"o1", "o2"} {
		args := orchestratorArgs(t, ownerURL, workers, "--name", name, "--shutdown-grace", "10s", "--mcp-config", cfg,
			"--poll-interval", e2ePoll, "--sweep-interval", e2eSweep)
		p := startChild(t, name, "orchestrator serving", env, append(args, accept...))
		procs = append(procs, p)
		orchs = append(orchs, &orchestratorProc{addr: p.addr, client: dial(t, p.addr)})
	}
	approver := approveAll(t, orchs[1].client)

	// The load: runs on both orchestrators, each task writing once (the
	// write waits for approval) and calling the model 3 times.
	var runIDs []string
	start := func(key string, limit int64, via *orchestratorProc) string {
		s := e2eSpec(key, failoverTasks, limit)
		for _, task := range s.Tasks {
			task.AllowedTools = []string{tool}
			task.TokenBudget = min(20_000, limit)
		}
		r, err := via.client.StartRun(t.Context(), &fanoutv1.StartRunRequest{Spec: s})
		if err != nil {
			t.Fatal(err)
		}
		runIDs = append(runIDs, r.GetRunId())
		return r.GetRunId()
	}
	for i := range failoverRuns {
		start(fmt.Sprintf("failover-%d", i), 1_000_000, orchs[i%2])
	}
	tight := start("failover-tight", 4_000, orchs[0])
	watched := map[string]<-chan watchResult{}
	for i, id := range runIDs {
		watched[id] = watchInBackground(orchs[i%2].client, id)
	}

	// The kill: once writes were approved and calls are in flight.
	primary := openPool(t, pair.primary.URL("fanout"))
	var heldAtKill int
	waitFor(t, 60*time.Second, "writes done and model calls in flight", func() (bool, string) {
		var done int
		if err := primary.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM tool_calls WHERE state = 'done'),
			(SELECT count(*) FROM reservation WHERE state = 'held')`).Scan(&done, &heldAtKill); err != nil {
			t.Fatal(err)
		}
		return done >= 3 && heldAtKill >= 4, fmt.Sprintf("%d writes done, %d reservations held", done, heldAtKill)
	})
	primary.Close()
	var stopped int
	if !synchronous {
		// The standby falls behind: its WAL receiver stops, as when the
		// network to it is slow, while the primary goes on acknowledging.
		stopped = pair.walReceiver(t)
		if err := syscall.Kill(stopped, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		// Registered before the pair's Stop runs: a failure below must
		// not leave the receiver stopped for the standby's shutdown.
		t.Cleanup(func() { _ = syscall.Kill(stopped, syscall.SIGCONT) })
		lag := time.NewTimer(700 * time.Millisecond)
		<-lag.C
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	killed := time.Now()
	if err := pair.primary.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if stopped != 0 {
		// What the primary sent meanwhile is in the receiver's socket
		// buffer, not in the standby's WAL: the receiver dies with it (the
		// standby restarts its recovery from its own WAL), as a network
		// that lost it would leave it.
		if err := syscall.Kill(stopped, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// The standby restarts its processes after a child's SIGKILL; a
		// promote request in that moment is dropped. Promote once it is
		// back in recovery.
		waitFor(t, 30*time.Second, "the standby back in recovery after its WAL receiver was killed", func() (bool, string) {
			rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
			defer rcancel()
			conn, err := pgx.Connect(rctx, pair.standby.URL("postgres"))
			if err != nil {
				return false, err.Error()
			}
			defer func() { _ = conn.Close(rctx) }()
			var in bool
			if err := conn.QueryRow(rctx, `SELECT pg_is_in_recovery()`).Scan(&in); err != nil {
				return false, err.Error()
			}
			return in, "not in recovery"
		})
	}
	if err := pair.standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Since(killed)

	// Serving again: a new run is taken (its run, tasks and ledger
	// accounts written on the new primary).
	var serving time.Duration
	waitFor(t, 60*time.Second, "the fleet taking a new run after the failover", func() (bool, string) {
		s := e2eSpec("failover-probe", 1, 100_000)
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer rcancel()
		r, err := orchs[0].client.StartRun(rctx, &fanoutv1.StartRunRequest{Spec: s})
		if err != nil {
			return false, err.Error()
		}
		serving = time.Since(killed)
		runIDs = append(runIDs, r.GetRunId())
		watched[r.GetRunId()] = watchInBackground(orchs[0].client, r.GetRunId())
		return true, ""
	})
	t.Logf("killed the primary; standby promoted %v later; the fleet took a new run %v after the kill",
		promoted.Round(time.Millisecond), serving.Round(time.Millisecond))

	// Every run ends by itself, even after an asynchronous failover: a
	// write waiting for approval whose record was lost ends its wait, and
	// a stream ahead of a database that lost events ends on the run's
	// state. A run that does not is a failure, reported with what the
	// database and the processes say of it, then cancelled (the runbook's
	// remedy) so that the checks below still run.
	ended := map[string]*fanoutv1.RunFinished{}
	var stuck []string
	deadline := time.After(failoverRunsEnd)
	for _, id := range runIDs {
		select {
		case w := <-watched[id]:
			if w.err != nil || len(w.events) == 0 || w.events[len(w.events)-1].GetRunFinished() == nil {
				t.Errorf("run %s: its watch ended with %v after %d events, not RunFinished", id, w.err, len(w.events))
				for _, p := range procs {
					for _, line := range strings.Split(p.logs.all(), "\n") {
						if strings.Contains(line, "internal error") {
							t.Logf("  %s", line)
						}
					}
				}
				continue
			}
			ended[id] = w.events[len(w.events)-1].GetRunFinished()
		case <-deadline:
			deadline = closedTimer
			stuck = append(stuck, id)
		}
	}
	t.Logf("%d runs ended by themselves within %v of the kill, %d did not", len(ended), time.Since(killed).Round(time.Millisecond), len(stuck))
	if len(stuck) > 0 {
		t.Errorf("%d runs did not end within %v of the kill: %v", len(stuck), failoverRunsEnd, stuck)
		reportStuck(t, pair.standby.URL("fanout"), stuck, procs)
	}
	for _, id := range stuck {
		if _, err := orchs[1].client.CancelRun(t.Context(), &fanoutv1.CancelRunRequest{RunId: id, Reason: "stuck after an asynchronous failover"}); err != nil {
			t.Errorf("cancel stuck run %s: %v", id, err)
		}
		w := watchAll(t, orchs[1].client, id, nil)
		ended[id] = w[len(w)-1].GetRunFinished()
	}
	approver()

	pool := openPool(t, pair.standby.URL("fanout")) // the new primary
	var calls []call
	for _, w := range workers {
		for _, id := range runIDs {
			calls = append(calls, w.calls(t, id)...)
		}
	}
	// The positive control: the kill cut calls off — model calls ran
	// across it, and the processes retried database calls.
	across, retries := 0, 0
	for _, c := range calls {
		if c.Start.Before(killed) && c.End.After(killed) {
			across++
		}
	}
	for _, p := range procs {
		retries += strings.Count(p.logs.all(), retryLogLine)
	}
	t.Logf("reservations held just before the kill: %d; model calls running across it: %d; database calls retried: %d",
		heldAtKill, across, retries)
	if retries == 0 {
		t.Error("the kill cut nothing off: the test proved nothing")
	}
	lost := lostGrants(t, pool, calls)
	writes := writesSent(t, shimDir)
	twice := 0
	for _, n := range writes {
		if n > 1 {
			twice++
		}
	}
	finished, tasks := tasksFinished(t, pool, runIDs)
	states := map[string]int{}
	for _, f := range ended {
		states[f.GetState().String()]++
	}
	t.Logf("runs %d (%v), tasks %d finished %d times, model calls %d, writes sent %d (%d keys sent more than once), "+
		"grants the workers held that the new primary lacks: %d", len(runIDs), states, tasks, finished, len(calls),
		len(writes), twice, len(lost))

	// Conservation holds on the new primary either way: it is one
	// consistent database, whatever it lost.
	unclosed := 0
	for _, id := range runIDs {
		if synchronous {
			waitClosed(t, pool, id)
		} else if accountState(t, pool, id) != "closed" {
			unclosed++ // its close was acknowledged, then lost
		}
		checkConserved(t, pool, id)
	}
	if synchronous {
		for _, l := range lost {
			t.Errorf("lost grant: %s", l)
		}
		if finished != tasks {
			t.Errorf("%d TaskFinished events for %d tasks: a task finished twice", finished, tasks)
		}
		if tasks != failoverRuns*failoverTasks+failoverTasks+1 {
			t.Errorf("%d tasks finished, want %d", tasks, failoverRuns*failoverTasks+failoverTasks+1)
		}
		if twice > 0 {
			t.Errorf("%d writes were sent more than once", twice)
		}
		if len(writes) == 0 {
			t.Error("no write reached the server: the load had no tools")
		}
		var tightCalls []call
		for _, c := range calls {
			if c.RunID == tight {
				tightCalls = append(tightCalls, c)
			}
		}
		ex := exhaustionEntries(t, pool, tight)
		checkPaidBeforeExhaustion(t, ex, tightCalls)
		return
	}
	// Asynchronous: the lag lost acknowledged grants — the positive control.
	if len(lost) == 0 {
		t.Fatal("no grant was lost with the standby's WAL receiver stopped before the kill: the test provoked nothing")
	}
	detected, unnoticed := 0, 0
	for _, l := range lost {
		if l.call.End.After(killed) {
			detected++
		} else {
			unnoticed++
		}
	}
	t.Logf("asynchronous: %d grants lost; %d of their calls were still running at the kill and were refused at their "+
		"settle or renewal (the new primary has no such reservation), %d had ended and settled before it: "+
		"spent at the provider, in no account; %d runs' accounts not closed", len(lost), detected, unnoticed, unclosed)
	for _, l := range lost[:min(len(lost), 5)] {
		t.Logf("  %s", l)
	}
}

// reportStuck logs what the database says of each run that did not end,
// and the warnings of the processes about it (the orchestrators' others
// too, for the first).
func reportStuck(t *testing.T, url string, stuck []string, procs []*workerProc) {
	pool := openPool(t, url)
	defer pool.Close()
	for i, id := range stuck {
		var state, tasks string
		var events, lastSeq int64
		if err := pool.QueryRow(context.Background(), `SELECT r.state,
			(SELECT string_agg(s || ' ' || n, ', ') FROM (SELECT status AS s, count(*) AS n FROM task
				WHERE run_id = r.run_id GROUP BY status) x),
			(SELECT count(*) FROM run_event WHERE run_id = r.run_id),
			(SELECT coalesce(max(sequence), 0) FROM run_event WHERE run_id = r.run_id)
			FROM run r WHERE r.run_id = $1`, id).Scan(&state, &tasks, &events, &lastSeq); err != nil {
			t.Logf("stuck run %s: %v", id, err)
			continue
		}
		t.Logf("stuck run %s: %s in the database, tasks %s, %d events up to sequence %d", id, state, tasks, events, lastSeq)
		for j, p := range procs {
			orchestrator := j >= len(procs)-2
			for _, line := range strings.Split(p.logs.all(), "\n") {
				if strings.Contains(line, `"level":"INFO"`) || strings.Contains(line, retryLogLine) {
					continue
				}
				if strings.Contains(line, id) || (i == 0 && orchestrator && !strings.Contains(line, "run_id")) {
					t.Logf("  %s: %.400s", p.name, line)
				}
			}
		}
	}
}

// accountState is the state of the run's ledger account.
func accountState(t *testing.T, pool *store.Pool, runID string) string {
	t.Helper()
	var state string
	if err := pool.QueryRow(context.Background(), `SELECT state FROM run_spend WHERE run_id = $1`, runID).Scan(&state); err != nil {
		t.Fatal(err)
	}
	return state
}

// chmod711 lets the cluster's OS user (when we are root) enter d.
func chmod711(d string) error { return syscall.Chmod(d, 0o711) }

// lostGrant is a call a worker made under a reservation that the ledger
// of the new primary does not hold for its run.
type lostGrant struct{ call call }

func (l lostGrant) String() string {
	return fmt.Sprintf("call %s/%s/%d on %s under reservation %d (%v to %v)", l.call.RunID, l.call.TaskID, l.call.Iteration,
		l.call.worker, l.call.ReservationID, l.call.Start.Format("15:04:05.000"), l.call.End.Format("15:04:05.000"))
}

// lostGrants compares the workers' own record of what they were granted
// (each sim call names its reservation) with the ledger's reserve entries.
func lostGrants(t *testing.T, pool *store.Pool, calls []call) []lostGrant {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT reservation_id, run_id FROM ledger_entry WHERE kind = 'reserve'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	granted := map[int64]string{}
	for rows.Next() {
		var id int64
		var run string
		if err := rows.Scan(&id, &run); err != nil {
			t.Fatal(err)
		}
		granted[id] = run
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var out []lostGrant
	for _, c := range calls {
		if granted[c.ReservationID] != c.RunID {
			out = append(out, lostGrant{c})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].call.Start.Before(out[j].call.Start) })
	return out
}

// writesSent counts the create_entities requests the server got, by
// idempotency key.
func writesSent(t *testing.T, shimDir string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, r := range readShimRecords(t, shimDir) {
		if r.Kind == "request" && r.Tool == "create_entities" {
			key, _ := r.Meta[mcp.MetaIdempotencyKey].(string)
			out[key]++
		}
	}
	return out
}

// tasksFinished counts the TaskFinished events of the runs, and the tasks
// they name.
func tasksFinished(t *testing.T, pool *store.Pool, runIDs []string) (events, tasks int) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT count(*),
		count(DISTINCT (run_id, event->'task_finished'->'outcome'->>'task_id'))
		FROM run_event WHERE run_id = ANY($1) AND event ? 'task_finished'`, runIDs).Scan(&events, &tasks); err != nil {
		t.Fatal(err)
	}
	return events, tasks
}

// approveAll approves every write waiting for approval, through c, until
// the returned function is called.
func approveAll(t *testing.T, c fanoutv1.OrchestratorServiceClient) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			lctx, lcancel := context.WithTimeout(ctx, 5*time.Second)
			list, err := c.ListApprovals(lctx, &fanoutv1.ListApprovalsRequest{PageSize: 200})
			for _, p := range list.GetCalls() {
				if err == nil {
					_, _ = c.ApproveToolCall(lctx, &fanoutv1.ApproveToolCallRequest{CallId: p.GetCallId(), Reason: "failover tier"})
				}
			}
			lcancel()
		}
	}()
	return func() { cancel(); wg.Wait() }
}

// TestSlowWALFlush: a synchronous standby that stalls (its WAL receiver
// stopped 300 ms of every 400 ms, as a slow disk or a congested link
// behind it would) makes every commit on the primary wait for it. A run
// of 12 tasks is made on the stalling pair after the same run without
// stalls: it still succeeds with every task, conserved; how much slower it
// is gets logged (not asserted: it is the machine's).
func TestSlowWALFlush(t *testing.T) {
	pair, ownerURL := startPair(t, true)
	env := []string{envUnsafeDurability + "="}
	var workers []*workerProc
	for i := range 2 {
		workers = append(workers, startWorkerProcEnv(t, ownerURL, fmt.Sprintf("w%d", i+1), env,
			"--sim-latency", "100ms", "--sim-tool-calls", "1", "--sim-finish-after", "2",
			"--poll-interval", e2ePoll, "--sweep-interval", e2eSweep))
	}
	o := startChild(t, "o1", "orchestrator serving", env, orchestratorArgs(t, ownerURL, workers, "--name", "o1",
		"--shutdown-grace", "10s", "--poll-interval", e2ePoll, "--sweep-interval", e2eSweep))
	client := dial(t, o.addr)
	pool := openPool(t, pair.primary.URL("fanout"))
	probe := openPool(t, pair.primary.URL("postgres"))
	if _, err := probe.Exec(context.Background(), `CREATE TABLE public.stall_probe (at timestamptz)`); err != nil {
		t.Fatal(err)
	}
	run := func(key string) time.Duration {
		s := e2eSpec(key, 12, 1_000_000)
		began := time.Now()
		evs := runAll(t, client, s)
		took := time.Since(began)
		fin := evs[len(evs)-1].GetRunFinished()
		checkOutcomes(t, s, fin.GetResult().GetTasks())
		for _, o := range fin.GetResult().GetTasks() {
			if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
				t.Errorf("run %s: task %s ended %s: %s", key, o.GetTaskId(), o.GetStatus(), o.GetSummary().GetError())
			}
		}
		waitClosed(t, pool, evs[0].GetRunId())
		checkConserved(t, pool, evs[0].GetRunId())
		return took
	}
	steady := run("steady")

	receiver := pair.walReceiver(t)
	t.Cleanup(func() { _ = syscall.Kill(receiver, syscall.SIGCONT) })
	stop := make(chan struct{})
	stalled := make(chan int, 1)
	var stopOnce sync.Once
	t.Cleanup(func() { stopOnce.Do(func() { close(stop) }) })
	go func() {
		n := 0
		defer func() { stalled <- n }()
		for {
			if err := syscall.Kill(receiver, syscall.SIGSTOP); err != nil {
				return
			}
			n++
			select {
			case <-stop:
			case <-time.After(300 * time.Millisecond):
			}
			_ = syscall.Kill(receiver, syscall.SIGCONT)
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	slow := run("stalled")
	stopOnce.Do(func() { close(stop) })
	n := <-stalled

	// Commits did wait: one on the stalling pair takes about the stall.
	var commitWait time.Duration
	for range 3 {
		_ = syscall.Kill(receiver, syscall.SIGSTOP)
		began := time.Now()
		resume := time.AfterFunc(300*time.Millisecond, func() { _ = syscall.Kill(receiver, syscall.SIGCONT) })
		if _, err := probe.Exec(context.Background(), `INSERT INTO public.stall_probe VALUES (now())`); err != nil {
			t.Fatal(err)
		}
		commitWait = max(commitWait, time.Since(began))
		resume.Stop()
		_ = syscall.Kill(receiver, syscall.SIGCONT)
	}
	t.Logf("12-task run: %v with a steady standby, %v with the standby stalled %d times (300 ms of every 400 ms); "+
		"a commit during a stall waited %v", steady.Round(time.Millisecond), slow.Round(time.Millisecond), n,
		commitWait.Round(time.Millisecond))
	if n < 2 {
		t.Errorf("the standby stalled %d times during the run: the run did not span the stalls", n)
	}
	if commitWait < 250*time.Millisecond {
		t.Errorf("a commit during a 300 ms stall of the synchronous standby took %v: the primary did not wait for it", commitWait)
	}
}
