package main

// End-to-end tests of the whole service: real PostgreSQL, worker PROCESSES
// (this test binary re-executed as `fanout worker`), an orchestrator run by
// Main in this process, real gRPC on loopback ports.

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// Timing knobs shared by the tests' processes. Polls are short so that a
// lost NOTIFY costs little; they are not what the tests rely on.
const (
	e2ePoll  = "200ms"
	e2eSweep = "200ms"
)

// exhaustionMargin is how long after this test heard a run's exhaustion
// notice every worker may take to have stopped the run's calls. It is
// generous (the notice reaches a listener within tens of milliseconds, and
// the poll fallback runs every e2ePoll) yet shorter than the orchestrator's
// CancelGrace (2s, its default): after that the orchestrator cuts the calls
// itself, and a worker that never acted on the notice would look like one
// that did.
const exhaustionMargin = time.Second

// e2eSimLatency is how long each sim call of TestE2E takes: longer than
// exhaustionMargin, so that a call a worker fails to stop outlives the
// margin, and long enough that every worker has calls in flight.
const e2eSimLatency = 1500 * time.Millisecond

// cluster is one database, worker processes and an in-process orchestrator.
type cluster struct {
	url     string
	pool    *store.Pool
	workers []*workerProc
	orch    *orchestratorProc
	notices *runStateListener
}

// newCluster starts one worker process per element of workerFlags (each
// with its own extra flags) and an orchestrator over all of them.
func newCluster(t testing.TB, workerFlags [][]string, orchFlags ...string) *cluster {
	t.Helper()
	c := startWorkers(t, workerFlags)
	c.orch = startOrchestratorMain(t, c.url, c.workers,
		append([]string{"--poll-interval", e2ePoll, "--sweep-interval", e2eSweep}, orchFlags...)...)
	return c
}

// startWorkers makes a database and starts one worker process per element
// of workerFlags (each with its own extra flags) on it.
func startWorkers(t testing.TB, workerFlags [][]string) *cluster {
	t.Helper()
	c := &cluster{url: storetest.NewDB(t)}
	c.pool = openPool(t, c.url)
	c.notices = listenRunState(t, c.url)
	// Start the processes one after the other: each may be a -race binary
	// and the machine is small; starting them at once only makes each slower.
	for i, extra := range workerFlags {
		flags := append([]string{"--poll-interval", e2ePoll, "--sweep-interval", e2eSweep}, extra...)
		c.workers = append(c.workers, startWorkerProc(t, c.url, "w"+strconv.Itoa(i+1), flags...))
	}
	return c
}

// workerNames returns the names of the cluster's worker processes.
func (c *cluster) workerNames() []string {
	names := make([]string, len(c.workers))
	for i, w := range c.workers {
		names[i] = w.name
	}
	return names
}

// calls returns every sim call of run runID on every worker, once every
// settled reservation of the run has its call in a log (a worker logs a
// call when it ends, just before it settles it).
func (c *cluster) calls(t testing.TB, runID string) []call {
	t.Helper()
	var out []call
	waitFor(t, 20*time.Second, "sim logs hold every settled call of run "+runID, func() (bool, string) {
		out = out[:0]
		for _, w := range c.workers {
			out = append(out, w.calls(t, runID)...)
		}
		var settled, held int
		if err := c.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE state = 'settled'),
			count(*) FILTER (WHERE state = 'held') FROM reservation WHERE run_id = $1`, runID).Scan(&settled, &held); err != nil {
			t.Fatal(err)
		}
		return held == 0 && len(out) == settled, "calls " + strconv.Itoa(len(out)) + ", settled " +
			strconv.Itoa(settled) + ", held " + strconv.Itoa(held)
	})
	return out
}

// exhaustion is what the ledger and this test know of a run's exhaustion.
// Grants, settlements and the exhaustion all lock the run's account row
// before they write their entry, so entry ids are in commit order.
type exhaustion struct {
	entryID int64           // the 'exhaust' ledger entry
	began   time.Time       // its transaction's start (now()): a lower bound of the commit
	heard   time.Time       // when this test heard the NOTIFY: an upper bound of the commit
	reserve map[int64]int64 // reservation id -> its 'reserve' entry
	resolve map[int64]int64 // reservation id -> the entry that settled, voided or expired it
}

func (c *cluster) exhaustion(t *testing.T, runID string) exhaustion {
	t.Helper()
	ex := exhaustionEntries(t, c.pool, runID)
	heard, ok := c.notices.at("exhausted "+runID, 10*time.Second)
	if !ok {
		t.Fatalf("never heard the exhaustion NOTIFY of run %s", runID)
	}
	ex.heard = heard
	return ex
}

// exhaustionEntries is the run's exhaustion as its ledger entries say it
// (exhaustion.heard unset).
func exhaustionEntries(t *testing.T, pool *store.Pool, runID string) exhaustion {
	t.Helper()
	ctx := context.Background()
	var ex exhaustion
	if err := pool.QueryRow(ctx, `SELECT entry_id, created_at FROM ledger_entry
		WHERE run_id = $1 AND kind = 'exhaust'`, runID).Scan(&ex.entryID, &ex.began); err != nil {
		t.Fatalf("the run's exhaust entry: %v", err)
	}
	rows, err := pool.Query(ctx, `SELECT reservation_id, kind, entry_id FROM ledger_entry
		WHERE run_id = $1 AND kind IN ('reserve', 'settle', 'void', 'expire')`, runID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	ex.reserve, ex.resolve = map[int64]int64{}, map[int64]int64{}
	for rows.Next() {
		var r, e int64
		var kind string
		if err := rows.Scan(&r, &kind, &e); err != nil {
			t.Fatal(err)
		}
		if kind == "reserve" {
			ex.reserve[r] = e
		} else {
			ex.resolve[r] = e
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(ex.reserve) == 0 {
		t.Fatalf("run %s has no reserve entries in the ledger: nothing to check the exhaustion against", runID)
	}
	return ex
}

// checkPaidBeforeExhaustion asserts the sound form of "no call started
// after the exhausting commit": every call was paid by a reservation granted
// before the exhausting transaction. Every grant and the exhaustion lock the
// run's account row, so their entries' ids are in commit order.
func checkPaidBeforeExhaustion(t *testing.T, ex exhaustion, calls []call) {
	t.Helper()
	if len(calls) == 0 {
		t.Fatalf("no sim call of the run in any worker's log: nothing to check against the exhaustion (entry %d)", ex.entryID)
	}
	for _, cl := range calls {
		entry, ok := ex.reserve[cl.ReservationID]
		switch {
		case !ok:
			t.Errorf("call %s/%d on %s was paid by reservation %d, which the run never granted",
				cl.TaskID, cl.Iteration, cl.worker, cl.ReservationID)
		case entry > ex.entryID:
			t.Errorf("call %s/%d on %s was paid by reservation %d granted after the exhaustion (entry %d > %d)",
				cl.TaskID, cl.Iteration, cl.worker, cl.ReservationID, entry, ex.entryID)
		}
	}
	for r, entry := range ex.reserve {
		if entry > ex.entryID {
			t.Errorf("reservation %d was granted after the run was exhausted (entry %d > %d)", r, entry, ex.entryID)
		}
	}
}

// reportTiming logs how late the last call started relative to the
// exhausting commit (bracketed by its transaction start and our NOTIFY).
func reportTiming(t *testing.T, label string, ex exhaustion, calls []call) (lastStartAfterHeard time.Duration) {
	t.Helper()
	var last time.Time
	startedAfter := 0
	for _, cl := range calls {
		if cl.Start.After(last) {
			last = cl.Start
		}
		if cl.Start.After(ex.heard) {
			startedAfter++
		}
	}
	t.Logf("%s: %d calls; exhaust txn start -> NOTIFY heard here %v; last call start - NOTIFY heard = %v "+
		"(- txn start = %v); %d calls started after the NOTIFY was heard",
		label, len(calls), ex.heard.Sub(ex.began).Round(time.Microsecond), last.Sub(ex.heard).Round(time.Microsecond),
		last.Sub(ex.began).Round(time.Microsecond), startedAfter)
	return last.Sub(ex.heard)
}

func statusCounts(outcomes []*fanoutv1.TaskOutcome) map[fanoutv1.TaskStatus]int {
	m := map[fanoutv1.TaskStatus]int{}
	for _, o := range outcomes {
		m[o.GetStatus()]++
	}
	return m
}

var factTask = regexp.MustCompile(`of task t(\d+):`)

// checkFactsInDispatchOrder asserts that the joined facts come task by
// task in dispatch order (sim facts name their task). Facts of fewer than
// two tasks could not show an order, so they fail it.
func checkFactsInDispatchOrder(t *testing.T, facts []*fanoutv1.Fact) {
	t.Helper()
	prev := -1
	tasks := map[int]bool{}
	for _, f := range facts {
		m := factTask.FindStringSubmatch(f.GetText())
		if m == nil {
			continue // a tool result kept by a task stopped early
		}
		i, _ := strconv.Atoi(m[1])
		if i < prev {
			t.Errorf("fact of task t%02d comes after a fact of task t%02d: not in dispatch order", i, prev)
		}
		prev = i
		tasks[i] = true
	}
	if len(tasks) < 2 {
		t.Errorf("%d joined facts name %d tasks: the dispatch order of facts cannot be checked", len(facts), len(tasks))
	}
}

// TestE2E shares one cluster — 3 worker processes, one orchestrator — among
// runs that each have their own run id.
func TestE2E(t *testing.T) {
	t.Parallel()
	sim := []string{"--sim-latency", e2eSimLatency.String(), "--sim-tool-calls", "1", "--sim-finish-after", "3",
		"--sim-output-tokens", "150"}
	c := newCluster(t, [][]string{sim, sim, sim})

	t.Run("ExhaustionMidRun50Tasks", func(t *testing.T) {
		t.Parallel()
		s := e2eSpec("exhaust-50", 50, 30_000)
		evs := runAll(t, c.orch.client, s)
		fin := evs[len(evs)-1].GetRunFinished()
		runID := evs[0].GetRunId()
		if fin.GetState() != fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED {
			t.Fatalf("run ended %s (%q), want BUDGET_EXHAUSTED", fin.GetState(), fin.GetCancelCause())
		}
		// (c), (d): every task terminal, listed in dispatch order, in the
		// streamed result and in the persisted run.
		checkOutcomes(t, s, fin.GetResult().GetTasks())
		got, err := c.orch.client.GetRun(context.Background(), &fanoutv1.GetRunRequest{RunId: runID})
		if err != nil {
			t.Fatal(err)
		}
		checkOutcomes(t, s, got.GetRun().GetTasks())
		checkOutcomes(t, s, got.GetRun().GetResult().GetTasks())
		checkFactsInDispatchOrder(t, fin.GetResult().GetFacts())
		counts := statusCounts(fin.GetResult().GetTasks())
		if counts[fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED] == 0 || counts[fanoutv1.TaskStatus_TASK_STATUS_BUDGET_EXHAUSTED] == 0 {
			t.Errorf("want the budget to run out mid-run (some tasks SUCCEEDED, some BUDGET_EXHAUSTED): %v", counts)
		}
		t.Logf("task statuses: %v", counts)

		// (a): no call paid by a grant after the exhausting commit.
		calls := c.calls(t, runID)
		ex := c.exhaustion(t, runID)
		checkPaidBeforeExhaustion(t, ex, calls)
		// (b): every worker process had calls of the run in flight at the
		// exhausting commit and stopped them itself, at once.
		checkEveryWorkerStopped(t, ex, calls, c.workerNames())
		reportTiming(t, "50 tasks / 3 worker processes", ex, calls)
		// (e)
		spent, limit := checkConserved(t, c.pool, runID)
		t.Logf("spent %d of %d", spent, limit)
	})

	t.Run("DrainVersusCancel", func(t *testing.T) {
		t.Parallel()
		for _, policy := range []fanoutv1.ExhaustionPolicy{fanoutv1.ExhaustionPolicy_EXHAUSTION_POLICY_CANCEL,
			fanoutv1.ExhaustionPolicy_EXHAUSTION_POLICY_DRAIN} {
			name := strings.TrimPrefix(policy.String(), "EXHAUSTION_POLICY_")
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				s := e2eSpec("policy-"+name, 24, 8_000)
				s.OnExhaustion = policy
				evs := runAll(t, c.orch.client, s)
				fin := evs[len(evs)-1].GetRunFinished()
				runID := evs[0].GetRunId()
				if fin.GetState() != fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED {
					t.Fatalf("run ended %s (%q), want BUDGET_EXHAUSTED", fin.GetState(), fin.GetCancelCause())
				}
				checkOutcomes(t, s, fin.GetResult().GetTasks())
				calls := c.calls(t, runID)
				ex := c.exhaustion(t, runID)
				checkPaidBeforeExhaustion(t, ex, calls)

				var cancelled int
				for _, cl := range calls {
					if cl.Cancelled {
						cancelled++
					}
				}
				var estimated, reported int
				if err := c.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE estimated),
					count(*) FILTER (WHERE NOT estimated) FROM reservation WHERE run_id = $1 AND state = 'settled'`,
					runID).Scan(&estimated, &reported); err != nil {
					t.Fatal(err)
				}
				// After the exhausting commit no task can be granted
				// anything, so each task has at most the one call it was
				// making then; a call that ends after we heard the NOTIFY
				// started before the commit or was granted before it.
				after := map[string]int{}
				for _, cl := range calls {
					if cl.End.After(ex.heard) {
						after[cl.TaskID]++
						if after[cl.TaskID] > 1 {
							t.Errorf("task %s has %d calls ending after the exhaustion: a new call started", cl.TaskID, after[cl.TaskID])
						}
					}
				}
				switch policy {
				case fanoutv1.ExhaustionPolicy_EXHAUSTION_POLICY_CANCEL:
					if cancelled == 0 || estimated == 0 {
						t.Errorf("CANCEL: %d calls cancelled, %d estimated settlements; want in-flight calls cancelled and settled estimated",
							cancelled, estimated)
					}
					if estimated != cancelled {
						t.Errorf("CANCEL: %d cancelled calls but %d estimated settlements", cancelled, estimated)
					}
					checkEveryWorkerStopped(t, ex, calls, nil)
				case fanoutv1.ExhaustionPolicy_EXHAUSTION_POLICY_DRAIN:
					if cancelled != 0 || estimated != 0 {
						t.Errorf("DRAIN: %d calls cancelled, %d estimated settlements; want none", cancelled, estimated)
					}
					if len(after) == 0 {
						t.Errorf("DRAIN: no call was in flight at the exhaustion; the test proves nothing")
					}
					// In-flight calls finished and settled what they reported.
					for _, o := range fin.GetResult().GetTasks() {
						if o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_CANCELLED {
							t.Errorf("DRAIN: task %s ended CANCELLED", o.GetTaskId())
						}
					}
				}
				t.Logf("%s: %d calls, %d cancelled, %d settled estimated, %d reported, %d tasks had a call in flight; statuses %v",
					name, len(calls), cancelled, estimated, reported, len(after), statusCounts(fin.GetResult().GetTasks()))
				reportTiming(t, name, ex, calls)
				checkConserved(t, c.pool, runID)
			})
		}
	})

	t.Run("TaskBudgetAndIterationCap", func(t *testing.T) {
		t.Parallel()
		s := e2eSpec("task-limits", 6, 1_000_000)
		s.Tasks[1].TokenBudget = 560 // one iteration's worth: the second reservation is refused
		s.Tasks[4].MaxIterations = 2 // the sim answers in iteration 3
		evs := runAll(t, c.orch.client, s)
		fin := evs[len(evs)-1].GetRunFinished()
		runID := evs[0].GetRunId()
		if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
			t.Errorf("run ended %s (%q), want SUCCEEDED: task limits end tasks, not the run", fin.GetState(), fin.GetCancelCause())
		}
		checkOutcomes(t, s, fin.GetResult().GetTasks())
		for i, o := range fin.GetResult().GetTasks() {
			want := fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED
			switch i {
			case 1:
				want = fanoutv1.TaskStatus_TASK_STATUS_BUDGET_EXHAUSTED
			case 4:
				want = fanoutv1.TaskStatus_TASK_STATUS_ITERATION_LIMIT
			}
			if o.GetStatus() != want {
				t.Errorf("task %s ended %s (%s), want %s", o.GetTaskId(), o.GetStatus(), o.GetSummary().GetError(), want)
			}
			if o.GetSummary().GetIterations() == 0 {
				t.Errorf("task %s made no model call", o.GetTaskId())
			}
		}
		if it := fin.GetResult().GetTasks()[4].GetSummary().GetIterations(); it != 2 {
			t.Errorf("capped task made %d iterations, want 2", it)
		}
		var taskSpent, taskLimit int64
		if err := c.pool.QueryRow(context.Background(), `SELECT spent_tokens, limit_tokens FROM task_spend
			WHERE run_id = $1 AND task_id = 't01'`, runID).Scan(&taskSpent, &taskLimit); err != nil {
			t.Fatal(err)
		}
		if taskSpent == 0 || taskSpent > taskLimit {
			t.Errorf("budgeted task spent %d of %d", taskSpent, taskLimit)
		}
		var exhausts, reserves int
		if err := c.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE kind = 'exhaust'),
			count(*) FILTER (WHERE kind = 'reserve') FROM ledger_entry WHERE run_id = $1`, runID).Scan(&exhausts, &reserves); err != nil {
			t.Fatal(err)
		}
		if reserves == 0 {
			t.Errorf("run %s has no reserve entries: its ledger journal is not where this test looks", runID)
		}
		if exhausts != 0 {
			t.Errorf("the run account was exhausted: one task's budget must not end the run")
		}
		waitClosed(t, c.pool, runID)
		checkConserved(t, c.pool, runID)
	})

	t.Run("IdempotentRunThroughTheCLI", func(t *testing.T) {
		t.Parallel()
		s := e2eSpec("cli-same-key", 3, 1_000_000)
		b, err := protojson.Marshal(&fanoutv1.RunRequest{Spec: s})
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "spec.json")
		if err := os.WriteFile(file, b, 0o644); err != nil {
			t.Fatal(err)
		}
		cli := func(args ...string) string {
			t.Helper()
			var out, errOut bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if code := Main(ctx, append(args, "--addr", c.orch.addr), &out, &errOut, func(string) string { return "" }); code != 0 {
				t.Fatalf("fanout %v exited %d: %s", args, code, errOut.String())
			}
			return out.String()
		}
		first := strings.TrimSpace(cli("run", "-f", file, "--detach"))
		// The second call streams the run to its end (joining the first).
		lines := strings.Split(strings.TrimSpace(cli("run", "-f", file, "--json")), "\n")
		var last fanoutv1.RunEvent
		if err := protojson.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
			t.Fatalf("last line of `fanout run --json`: %v", err)
		}
		if last.GetRunId() != first || last.GetRunFinished() == nil {
			t.Fatalf("second `fanout run` streamed run %s ending with %T, want run %s to its RunFinished",
				last.GetRunId(), last.GetEvent(), first)
		}
		counts := func() (runs, accounts, entries int) {
			if err := c.pool.QueryRow(context.Background(), `SELECT
				(SELECT count(*) FROM run WHERE idempotency_key = 'cli-same-key'),
				(SELECT count(*) FROM account WHERE run_id IN (SELECT run_id FROM run WHERE idempotency_key = 'cli-same-key')),
				(SELECT count(*) FROM ledger_entry WHERE run_id = $1)`, first).Scan(&runs, &accounts, &entries); err != nil {
				t.Fatal(err)
			}
			return
		}
		waitClosed(t, c.pool, first) // the ledger closes the run just after RunFinished
		runs, accounts, entries := counts()
		third := strings.TrimSpace(cli("run", "-f", file, "--detach"))
		runs2, accounts2, entries2 := counts()
		if third != first || runs != 1 || runs2 != 1 || accounts != 4 || accounts2 != 4 || entries2 != entries {
			t.Errorf("same key: runs %s, %s; %d then %d runs, %d then %d accounts (want 4: run + 3 tasks), %d then %d ledger entries",
				first, third, runs, runs2, accounts, accounts2, entries, entries2)
		}
		// A different key is a different run: the comparison above can fail.
		other := strings.TrimSpace(cli("run", "-f", file, "--detach", "--idempotency-key", "cli-other-key"))
		if other == first || other == "" {
			t.Errorf("another key gave run %q, want a new run", other)
		}
		watchAll(t, c.orch.client, other, nil)
		checkConserved(t, c.pool, first)
	})
}

// checkEveryWorkerStopped asserts, worker by worker, what a run's
// exhaustion must do on every node (docs/ledger.md#i6-nothing-starts-after-exhaustion-or-cancel: every node
// hears the ledger's notice and cancels its own subagents of the run):
//
//   - every worker that had a call of the run in flight at the exhausting
//     commit cancelled one itself, within exhaustionMargin of the notice
//     being heard here (the orchestrator cuts calls only after its
//     CancelGrace, which is longer);
//   - none of its calls ran past the notice plus exhaustionMargin;
//   - no call it started after it had acted (cancelled a call of the run)
//     was allowed to run.
//
// A call was in flight at the exhausting commit if its reservation was
// granted before the 'exhaust' entry and resolved after it (entry ids, no
// clocks) and it was cancelled (nothing but the run's end cancels a call
// here) or still running when this test heard the notice. must names the
// workers the run was designed to keep busy: each must have had a call in
// flight, or the run shows nothing about it and the test fails.
func checkEveryWorkerStopped(t *testing.T, ex exhaustion, calls []call, must []string) {
	t.Helper()
	byWorker := map[string][]call{}
	for _, cl := range calls {
		byWorker[cl.worker] = append(byWorker[cl.worker], cl)
	}
	names := append([]string(nil), must...)
	for w := range byWorker {
		if !slices.Contains(names, w) {
			names = append(names, w)
		}
	}
	slices.Sort(names)
	deadline := ex.heard.Add(exhaustionMargin)
	busy := 0 // workers with a call of the run in flight at the exhausting commit
	for _, w := range names {
		var open, inFlight int
		var firstCancel, lastEnd time.Time
		for _, cl := range byWorker[w] {
			if cl.End.After(lastEnd) {
				lastEnd = cl.End
			}
			if cl.End.After(deadline) {
				t.Errorf("call %s/%d on %s (reservation %d, cancelled %v) ran until %v after the exhaustion notice "+
					"was heard here: every worker must have stopped the run's calls within %v",
					cl.TaskID, cl.Iteration, w, cl.ReservationID, cl.Cancelled, cl.End.Sub(ex.heard).Round(time.Millisecond),
					exhaustionMargin)
			}
			if cl.Cancelled && (firstCancel.IsZero() || cl.End.Before(firstCancel)) {
				firstCancel = cl.End
			}
			granted, resolved := ex.reserve[cl.ReservationID], ex.resolve[cl.ReservationID]
			if granted == 0 || granted > ex.entryID || (resolved != 0 && resolved < ex.entryID) {
				continue // not open in the ledger at the exhausting commit
			}
			open++
			if cl.Cancelled || cl.End.After(ex.heard) {
				inFlight++
			}
		}
		if inFlight == 0 {
			if slices.Contains(must, w) {
				t.Errorf("worker %s had no call of the run in flight at the exhausting commit (entry %d): %d calls there, "+
					"%d open in the ledger at that commit but ended before the notice; the run cannot show that this "+
					"worker acts on the exhaustion (give it more concurrency or sim latency)",
					w, ex.entryID, len(byWorker[w]), open)
			}
			continue // otherwise there was nothing of the run to stop there
		}
		busy++
		switch {
		case firstCancel.IsZero():
			t.Errorf("worker %s had %d calls of the run in flight at the exhausting commit (entry %d) and cancelled none "+
				"of them: it never acted on the exhaustion (its last call ended %v after the notice was heard here)",
				w, inFlight, ex.entryID, lastEnd.Sub(ex.heard).Round(time.Millisecond))
			continue
		case firstCancel.After(deadline):
			t.Errorf("worker %s first cancelled a call of the run %v after the exhaustion notice was heard here, "+
				"past the %v margin: it did not act when it heard the notice", w,
				firstCancel.Sub(ex.heard).Round(time.Millisecond), exhaustionMargin)
		}
		t.Logf("worker %s: %d calls of the run, %d in flight at the exhausting commit; first cancel %v and last call end %v "+
			"after the notice was heard here", w, len(byWorker[w]), inFlight,
			firstCancel.Sub(ex.heard).Round(time.Millisecond), lastEnd.Sub(ex.heard).Round(time.Millisecond))
		// Once the worker has acted it knows the run ended: a call that
		// starts after that must be cancelled at once. One may still be
		// stamped as starting just after: the loop checks the run's state
		// before the call, and the sim stamps Start only once it gets its
		// log's lock, which the cancelled calls hold while they write.
		for _, cl := range byWorker[w] {
			if cl.Start.After(firstCancel) && !cl.Cancelled {
				t.Errorf("call %s/%d started on %s %v after that worker cancelled a call of the run, and ran to its end",
					cl.TaskID, cl.Iteration, w, cl.Start.Sub(firstCancel))
			}
		}
	}
	if busy == 0 {
		t.Errorf("no worker had a call of the run in flight at the exhausting commit (entry %d): nothing shows that "+
			"the workers act on the exhaustion", ex.entryID)
	}
}

// TestE2EKillWorker: kill -9 of one worker process while its subagents are
// in model calls. Its tasks are dispatched again, as new attempts, to the
// live workers and succeed there, as do the others; its reservations are
// reclaimed by lease expiry (counted as estimated spend, not voided) and
// the ledger is conserved with nothing left held.
func TestE2EKillWorker(t *testing.T) {
	t.Parallel()
	fast := []string{"--sim-latency", "300ms", "--sim-tool-calls", "1", "--sim-finish-after", "2",
		"--lease-ttl", "2s"}
	// The victim's calls last long, so that they are in flight when it dies.
	slow := []string{"--sim-latency", "60s", "--sim-tool-calls", "1", "--sim-finish-after", "2",
		"--lease-ttl", "2s"}
	c := newCluster(t, [][]string{fast, slow, fast})
	victim := c.workers[1]

	s := e2eSpec("kill-9", 9, 1_000_000)
	s.Limits.MaxConcurrency = 9
	started, err := c.orch.client.StartRun(context.Background(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := started.GetRunId()
	// Kill the victim once it holds a reservation for every task it got.
	waitFor(t, 30*time.Second, "the victim holds reservations in flight", func() (bool, string) {
		var held int
		if err := c.pool.QueryRow(context.Background(), `SELECT count(*) FROM open_reservations
			WHERE run_id = $1 AND holder = $2`, runID, victim.name).Scan(&held); err != nil {
			t.Fatal(err)
		}
		return held == 3, strconv.Itoa(held) + " held"
	})
	victim.kill(t)
	killed := time.Now()

	evs := watchAll(t, c.orch.client, runID, nil)
	fin := evs[len(evs)-1].GetRunFinished()
	checkOutcomes(t, s, fin.GetResult().GetTasks())
	onVictim := map[string]bool{}
	for _, ev := range evs {
		if st := ev.GetTaskStarted(); st != nil && st.GetWorker() == victim.name {
			onVictim[st.GetTaskId()] = true
		}
	}
	for _, o := range fin.GetResult().GetTasks() {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED || o.GetWorker() == victim.name {
			t.Errorf("task %s ended %s on %s (%s), want SUCCEEDED on a live worker", o.GetTaskId(), o.GetStatus(),
				o.GetWorker(), o.GetSummary().GetError())
		}
	}
	var attempts int
	if err := c.pool.QueryRow(context.Background(), `SELECT count(*) FROM account
		WHERE run_id = $1 AND kind = 'task' AND attempt = 2`, runID).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if len(onVictim) != 3 || attempts != 3 {
		t.Errorf("%d tasks started on the killed worker, %d tasks at attempt 2; want 3 and 3 (each dispatched again once)",
			len(onVictim), attempts)
	}

	// Nothing stays held: the survivors' and the orchestrator's sweepers
	// post the dead holder's reservations once their leases run out.
	waitFor(t, 20*time.Second, "no open reservations left", func() (bool, string) {
		var open int
		if err := c.pool.QueryRow(context.Background(), `SELECT count(*) FROM open_reservations WHERE run_id = $1`,
			runID).Scan(&open); err != nil {
			t.Fatal(err)
		}
		return open == 0, strconv.Itoa(open) + " open"
	})
	t.Logf("victim's reservations resolved within %v of the kill", time.Since(killed).Round(time.Millisecond))
	rows, err := c.pool.Query(context.Background(), `SELECT reservation_id, state, estimated, spent, amount
		FROM reservation WHERE run_id = $1 AND holder = $2`, runID, victim.name)
	if err != nil {
		t.Fatal(err)
	}
	var expired int
	for rows.Next() {
		var id, spent, amount int64
		var state string
		var estimated bool
		if err := rows.Scan(&id, &state, &estimated, &spent, &amount); err != nil {
			t.Fatal(err)
		}
		if state != "expired" || !estimated || spent != amount {
			t.Errorf("killed worker's reservation %d: %s, estimated %v, spent %d of %d; want expired and counted in full",
				id, state, estimated, spent, amount)
		}
		expired++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if expired != 3 {
		t.Errorf("killed worker held %d reservations, want 3", expired)
	}
	waitClosed(t, c.pool, runID)
	checkConserved(t, c.pool, runID)
}

// waitClosed waits for the orchestrator to close the run's ledger accounts.
func waitClosed(t *testing.T, pool *store.Pool, runID string) {
	t.Helper()
	waitFor(t, 20*time.Second, "run account closed", func() (bool, string) {
		var state string
		if err := pool.QueryRow(context.Background(), `SELECT state FROM run_spend WHERE run_id = $1`, runID).Scan(&state); err != nil {
			t.Fatal(err)
		}
		return state == "closed", state
	})
}
