package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// nestedSpec is the three-level tree of docs/budget.md#nested-fan-out: a
// root of four tasks that each fan out to three, one of which fans out to
// two more (4 + 12 + 2 tasks, 6 runs).
func nestedSpec(key string, limit int64) *fanoutv1.RunSpec {
	s := e2eSpec(key, 4, limit)
	s.FanOut = &fanoutv1.FanOut{MaxDepth: 2}
	s.Budget.MinReservationTokens = 0
	s.Model.MaxOutputTokens = 64
	for i, task := range s.Tasks {
		task.AllowedTools = nil
		task.TokenBudget = limit / 4
		task.Instruction = fmt.Sprintf("study area %d fan out(part a | part b | part c)", i)
	}
	s.Tasks[1].Instruction = "study area 1 fan out(part a | part b | part c fan out(detail x | detail y))"
	return s
}

// treeRun is one run of a tree of child runs.
type treeRun struct {
	id, state string
	depth     int
	endEntry  int64     // its first 'exhaust' or 'cancel' entry (0: none)
	endAt     time.Time // that entry's transaction's start
	late      int       // reservations granted on it after that entry
	own       int64     // what its own tasks spent (run_tree_spend)
}

// tree reads the runs of the tree under root.
func (c *cluster) tree(t *testing.T, root string) []treeRun {
	t.Helper()
	rows, err := c.pool.Query(context.Background(), `
		SELECT r.run_id, r.state, r.depth, coalesce(e.entry_id, 0), coalesce(e.created_at, 'epoch'),
			(SELECT count(*) FROM ledger_entry g WHERE g.run_id = r.run_id AND g.kind = 'reserve'
				AND e.entry_id IS NOT NULL AND g.entry_id > e.entry_id)::int,
			s.own_spent_tokens
		FROM run r
		JOIN account a ON a.run_id = r.run_id AND a.kind = 'run'
		JOIN run_tree_spend s ON s.run_id = r.run_id
		LEFT JOIN LATERAL (SELECT entry_id, created_at FROM ledger_entry x
			WHERE x.account_id = a.account_id AND x.kind IN ('exhaust', 'cancel') ORDER BY entry_id LIMIT 1) e ON true
		WHERE r.run_id = $1 OR r.root_run_id = $1 ORDER BY r.depth, r.created_at`, root)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []treeRun
	for rows.Next() {
		var r treeRun
		if err := rows.Scan(&r.id, &r.state, &r.depth, &r.endEntry, &r.endAt, &r.late, &r.own); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestNestedFanOutE2E runs the three-level tree on two worker processes
// and an orchestrator (docs/budget.md#nested-fan-out).
func TestNestedFanOutE2E(t *testing.T) {
	t.Parallel()
	// A call takes longer than exhaustionMargin, as TestE2E's: a call a
	// worker failed to stop would outlive the margin.
	sim := []string{"--sim-latency", e2eSimLatency.String(), "--sim-tool-calls", "1", "--sim-finish-after", "40",
		"--sim-output-tokens", "64"}
	c := newCluster(t, [][]string{sim, sim})

	t.Run("SpendRollsUp", func(t *testing.T) {
		t.Parallel()
		evs := runAll(t, c.orch.client, nestedSpec("nested-rolls-up", 2_000_000))
		fin := evs[len(evs)-1].GetRunFinished()
		root := evs[0].GetRunId()
		if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
			t.Fatalf("root ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
		}
		runs := c.tree(t, root)
		byDepth := map[int]int{}
		var own int64
		workers := map[string]int{} // calls of child runs, by worker
		for _, r := range runs {
			byDepth[r.depth]++
			own += r.own
			if r.state != "SUCCEEDED" {
				t.Errorf("run %s at depth %d ended %s", r.id, r.depth, r.state)
			}
			if r.depth > 0 {
				for _, w := range c.workers {
					workers[w.name] += len(w.calls(t, r.id))
				}
			}
		}
		if byDepth[0] != 1 || byDepth[1] != 4 || byDepth[2] != 1 {
			t.Errorf("runs by depth: %v, want 1, 4 and 1", byDepth)
		}
		spent, limit := checkConserved(t, c.pool, root)
		if own != spent || fin.GetResult().GetTotalTokens() != spent {
			t.Errorf("the root spent %d (its result says %d); its levels' own spend adds up to %d", spent,
				fin.GetResult().GetTotalTokens(), own)
		}
		if len(workers) != 2 || workers["w1"] == 0 || workers["w2"] == 0 {
			t.Errorf("calls of the child runs by worker: %v; want both worker processes to run some", workers)
		}
		grand := 0
		for _, f := range fin.GetResult().GetFacts() {
			if strings.Contains(f.GetText(), "detail x") || strings.Contains(f.GetText(), "detail y") {
				grand++
			}
		}
		if grand == 0 {
			t.Error("the root's facts hold none of its grandchild's")
		}
		t.Logf("6 runs, 18 tasks: the root spent %d of %d, its levels' own spend %d; calls of child runs by worker %v; "+
			"%d facts at the root, %d from the grandchild", spent, limit, own, workers, len(fin.GetResult().GetFacts()), grand)
	})

	t.Run("ExhaustedMidTree", func(t *testing.T) {
		t.Parallel()
		// As orchestrator's exhaustedTreeSpec: t00 fans out and ends; the
		// tree under t01 (one child task, two grandchild tasks) searches
		// for 40 iterations; t02 to t05 search once t00 has ended, on the
		// root's own budget, which runs out while t01's tree runs.
		s := nestedSpec("nested-exhausted", 100_000)
		s.Tasks[0].TokenBudget = 4_000
		s.Tasks[1].TokenBudget = 120_000
		s.Tasks[1].Instruction = "study area 1 fan out(part c fan out(detail x | detail y))"
		s.Tasks[1].AllowedTools = []string{"search"}
		s.Tasks[1].MaxIterations = 40
		for i := 4; i < 6; i++ {
			s.Tasks = append(s.Tasks, &fanoutv1.TaskSpec{Id: fmt.Sprintf("t%02d", i)})
		}
		for _, task := range s.Tasks[2:] {
			task.TokenBudget = 10_000
			task.Instruction = "search " + task.GetId()
			task.AllowedTools = []string{"search"}
			task.DependsOn = []string{"t00"}
		}
		evs := runAll(t, c.orch.client, s)
		fin := evs[len(evs)-1].GetRunFinished()
		root := evs[0].GetRunId()
		if fin.GetState() != fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED {
			t.Fatalf("root ended %s (%q), want BUDGET_EXHAUSTED", fin.GetState(), fin.GetCancelCause())
		}
		heard, ok := c.notices.at("exhausted "+root, 10*time.Second)
		if !ok {
			t.Fatalf("never heard the exhaustion NOTIFY of run %s", root)
		}
		runs := c.tree(t, root)
		rootEnd := runs[0].endAt
		endedWith := map[int]int{} // runs the root's exhausting transaction ended, by depth
		var calls []call
		for _, r := range runs {
			if r.state == "RUNNING" {
				t.Errorf("run %s at depth %d is still RUNNING", r.id, r.depth)
			}
			if r.late != 0 {
				t.Errorf("run %s at depth %d: %d reservations granted after its end entry %d", r.id, r.depth, r.late, r.endEntry)
			}
			if r.endEntry != 0 && r.endAt.Equal(rootEnd) {
				endedWith[r.depth]++
			}
			for _, w := range c.workers {
				calls = append(calls, w.calls(t, r.id)...)
			}
		}
		if endedWith[0] != 1 || endedWith[1] == 0 || endedWith[2] == 0 {
			t.Errorf("runs ended by the root's exhausting transaction, by depth: %v; want the root and runs at depths 1 "+
				"and 2 (t01's child and grandchild were running)", endedWith)
		}
		// Every worker process stopped every level's calls within the
		// bound of docs/ledger.md#i6-nothing-starts-after-exhaustion-or-cancel.
		deadline := heard.Add(exhaustionMargin)
		cancelled := map[string]int{}
		var last time.Time
		for _, cl := range calls {
			if cl.End.After(deadline) {
				t.Errorf("call %s/%s/%d on %s ran until %v after the exhaustion notice was heard: want every level's calls "+
					"stopped within %v", cl.RunID, cl.TaskID, cl.Iteration, cl.worker, cl.End.Sub(heard).Round(time.Millisecond),
					exhaustionMargin)
			}
			if cl.Cancelled {
				cancelled[cl.worker]++
			}
			if cl.End.After(last) {
				last = cl.End
			}
		}
		if cancelled["w1"] == 0 || cancelled["w2"] == 0 {
			t.Errorf("calls the exhaustion cancelled, by worker: %v; want each worker process to have stopped some", cancelled)
		}
		spent, limit := checkConserved(t, c.pool, root)
		t.Logf("%d runs; ended by the root's exhausting transaction, by depth: %v; calls cancelled by worker %v; "+
			"last call of the tree ended %v after the notice was heard (bound %v); the root spent %d of %d",
			len(runs), endedWith, cancelled, last.Sub(heard).Round(time.Millisecond), exhaustionMargin, spent, limit)
	})
}

// TestNestedFanOutSurvivesItsParentsWorkerKilled kills -9 the worker
// process running a task while the task waits for its child run: the
// task is dispatched again on the other worker, its new attempt takes up
// the same fan_out call (the call's row, issued, under its key) and waits
// for the same child, which runs on; one child, one call, the task's
// spend counted once.
func TestNestedFanOutSurvivesItsParentsWorkerKilled(t *testing.T) {
	t.Parallel()
	sim := []string{"--sim-latency", "300ms", "--sim-tool-calls", "1", "--sim-finish-after", "8",
		"--sim-output-tokens", "64"}
	c := newCluster(t, [][]string{sim, sim})

	s := nestedSpec("nested-worker-killed", 400_000)
	s.Tasks = s.Tasks[:1]
	s.Tasks[0].TokenBudget = 400_000
	s.Tasks[0].Instruction = "study fan out(part a | part b)"
	s.Tasks[0].AllowedTools = []string{"search"} // the child's tasks search for 8 iterations: 2.4 s
	resp, err := c.orch.client.StartRun(context.Background(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	root := resp.GetRunId()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	stream, err := c.orch.client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: root})
	if err != nil {
		t.Fatal(err)
	}
	var parentWorker, child string
	for child == "" {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("watch run %s before its child started: %v", root, err)
		}
		switch ev := m.GetEvent(); {
		case ev.GetTaskStarted() != nil:
			parentWorker = ev.GetTaskStarted().GetWorker()
		case ev.GetChildRunStarted() != nil:
			child = ev.GetChildRunStarted().GetChildRunId()
		}
	}
	var killed *workerProc
	for _, w := range c.workers {
		if strings.HasSuffix(parentWorker, w.addr) || parentWorker == w.name {
			killed = w
		}
	}
	if killed == nil {
		t.Fatalf("task t00 started on %q, which is none of the workers", parentWorker)
	}
	killed.kill(t)
	evs := runAllAfter(t, stream)
	fin := evs[len(evs)-1].GetRunFinished()
	if fin == nil || fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("root ended %v, want SUCCEEDED", fin)
	}
	got, err := c.orch.client.GetRun(context.Background(), &fanoutv1.GetRunRequest{RunId: child})
	if err != nil {
		t.Fatal(err)
	}
	childFacts := map[string]bool{}
	for _, f := range got.GetRun().GetResult().GetFacts() {
		childFacts[f.GetText()] = true
	}
	found := 0 // the child's facts, which only its answer to the call brings up
	for _, f := range fin.GetResult().GetFacts() {
		if childFacts[f.GetText()] {
			found++
		}
	}
	if found == 0 {
		t.Errorf("the root's facts hold none of its child's: the task's new attempt did not wait for the child's answer; "+
			"t00: %v", fin.GetResult().GetTasks()[0].GetSummary())
	}
	runs := c.tree(t, root)
	if len(runs) != 2 || runs[1].id != child || runs[1].state != "SUCCEEDED" {
		t.Errorf("the tree's runs: %+v; want the root and its one child %s, SUCCEEDED", runs, child)
	}
	var calls, attempts int
	if err := c.pool.QueryRow(context.Background(), `SELECT count(*), max(attempt) FROM tool_call
		WHERE run_id = $1 AND tool = 'fan_out'`, root).Scan(&calls, &attempts); err != nil {
		t.Fatal(err)
	}
	var redispatched int64
	if err := c.pool.QueryRow(context.Background(), `SELECT attempt FROM account WHERE run_id = $1 AND task_id = 't00'`,
		root).Scan(&redispatched); err != nil {
		t.Fatal(err)
	}
	if calls != 1 || redispatched < 2 {
		t.Errorf("%d fan_out calls recorded (the last by attempt %d), the task's attempt now %d: want one call, "+
			"taken up by a later attempt", calls, attempts, redispatched)
	}
	spent, limit := checkConserved(t, c.pool, root)
	var own int64
	for _, r := range runs {
		own += r.own
	}
	if own != spent {
		t.Errorf("the root spent %d; its levels' own spend adds up to %d", spent, own)
	}
	t.Logf("killed %s while t00 waited for child %s; t00 ran again as attempt %d and took up the call; "+
		"the root spent %d of %d", killed.name, child, redispatched, spent, limit)
}

// runAllAfter reads stream to the run's end.
func runAllAfter(t *testing.T, stream fanoutv1.OrchestratorService_WatchRunClient) []*fanoutv1.RunEvent {
	t.Helper()
	var evs []*fanoutv1.RunEvent
	for {
		m, err := stream.Recv()
		if err != nil {
			if len(evs) == 0 || evs[len(evs)-1].GetRunFinished() == nil {
				t.Fatalf("watch ended before the run did: %v", err)
			}
			return evs
		}
		evs = append(evs, m.GetEvent())
	}
}
