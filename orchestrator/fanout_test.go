package orchestrator_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/llm"
)

// treeSpec is a root of four tasks that each fan out to three, one of
// which fans out to two more: three levels, 4 + 12 + 2 tasks.
func treeSpec(key string, limit int64) *fanoutv1.RunSpec {
	s := spec(key, 4, limit)
	s.FanOut = &fanoutv1.FanOut{MaxDepth: 2}
	for i, t := range s.Tasks {
		t.TokenBudget = limit / 4
		t.Instruction = fmt.Sprintf("study area %d fan out(part a | part b | part c)", i)
	}
	s.Tasks[1].Instruction = "study area 1 fan out(part a | part b | part c fan out(detail x | detail y))"
	return s
}

func TestNestedFanOutSpendRollsUpToTheRoot(t *testing.T) {
	// Not parallel: trees of runs on workers with sims that take their
	// time; beside the package's timing-sensitive tests they starved them.
	b := setup(t)
	w1, _ := b.worker(t, "w1", llm.SimConfig{}, 8)
	w2, _ := b.worker(t, "w2", llm.SimConfig{}, 8)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w1, w2)

	evs := runStream(t, n.client, treeSpec("tree", 2_000_000))
	fin := checkEvents(t, evs)
	root := evs[0].GetRunId()
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Fatalf("root ended %s (%q)", fin.GetState(), fin.GetCancelCause())
	}
	started, finished := 0, 0
	for _, ev := range evs {
		if c := ev.GetChildRunStarted(); c != nil {
			started++
			// The child's budget is what the ledger carved from its task,
			// and its spec says so.
			got, err := n.client.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: c.GetChildRunId()})
			if err != nil {
				t.Fatal(err)
			}
			run := got.GetRun()
			if l := run.GetSpec().GetBudget().GetLimitTokens(); l != c.GetLimitTokens() || run.GetBudget().GetLimitTokens() != l ||
				run.GetParentRunId() != root || run.GetParentTaskId() != c.GetTaskId() || run.GetRootRunId() != root || run.GetDepth() != 1 {
				t.Errorf("child %s: spec budget %d, account %d, ChildRunStarted %d; parent %s/%s root %s depth %d",
					c.GetChildRunId(), l, run.GetBudget().GetLimitTokens(), c.GetLimitTokens(), run.GetParentRunId(),
					run.GetParentTaskId(), run.GetRootRunId(), run.GetDepth())
			}
		}
		if f := ev.GetChildRunFinished(); f != nil {
			finished++
			if f.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED || f.GetSpentTokens() <= 0 {
				t.Errorf("child %s of task %s ended %s having spent %d", f.GetChildRunId(), f.GetTaskId(), f.GetState(), f.GetSpentTokens())
			}
		}
	}
	if started != 4 || finished != 4 {
		t.Errorf("root saw %d ChildRunStarted and %d ChildRunFinished, want 4 and 4", started, finished)
	}
	grand := 0
	for _, f := range fin.GetResult().GetFacts() {
		if strings.Contains(f.GetText(), "detail x") || strings.Contains(f.GetText(), "detail y") {
			grand++
		}
	}
	if grand == 0 {
		t.Errorf("the root's facts hold none of the grandchildren's")
	}
	type level struct {
		runs       int
		own, spent int64
	}
	levels := map[int]*level{}
	rows, err := b.pool.Query(t.Context(), `SELECT depth, own_spent_tokens, spent_tokens FROM run_tree_spend WHERE root_run_id = $1`, root)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var d int
		var own, spent int64
		if err := rows.Scan(&d, &own, &spent); err != nil {
			t.Fatal(err)
		}
		if levels[d] == nil {
			levels[d] = &level{}
		}
		levels[d].runs++
		levels[d].own += own
		levels[d].spent += spent
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(levels) != 3 || levels[0].runs != 1 || levels[1].runs != 4 || levels[2].runs != 1 {
		t.Fatalf("run_tree_spend levels: %v", levels)
	}
	acct, err := b.ledger.RunAccount(t.Context(), root)
	if err != nil {
		t.Fatal(err)
	}
	var tasks int64 // the root's tasks' spend, their children's in it
	for _, o := range fin.GetResult().GetTasks() {
		tasks += o.GetTokensSpent()
	}
	if tasks != acct.Spent {
		t.Errorf("the root's tasks report %d tokens spent; the root spent %d", tasks, acct.Spent)
	}
	all := levels[0].own + levels[1].own + levels[2].own
	if acct.Spent != all || fin.GetResult().GetTotalTokens() != acct.Spent {
		t.Errorf("root spent %d (result total %d); its levels' own spend adds up to %d", acct.Spent,
			fin.GetResult().GetTotalTokens(), all)
	}
	t.Logf("levels: 0 %+v, 1 %+v, 2 %+v; root spent %d; %d facts, %d of the grandchildren", *levels[0], *levels[1], *levels[2],
		acct.Spent, len(fin.GetResult().GetFacts()), grand)
	b.checkLedger(t)
}

// exhaustedTreeSpec is a three-level tree whose root's budget runs out
// while the tree under task t01 (its child and grandchild) runs, on a sim
// that searches for 40 iterations (200 ms each) before it answers:
//   - t00 fans out to three quick tasks (they have no tools) and ends,
//     about 0.6 s in;
//   - t01 fans out at once to one task, which fans out to two: every task
//     under t01 may search 40 iterations, for 8 s, and the grandchild has
//     most of t01's budget (a child takes three quarters of what its task
//     has left, and a child of one task gives that task all of it);
//   - t02 to t05 search once t00 has ended, on the root's own budget,
//     which after t01's funding has about a quarter of its free tokens
//     left: four of them spend it within a second or two, seconds before
//     the tree under t01 could end.
func exhaustedTreeSpec(key string) *fanoutv1.RunSpec {
	s := treeSpec(key, 100_000)
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
	return s
}

// treeRuns are the runs of the tree under root (itself first) and how
// each ended.
func (b *testBundle) treeRuns(t *testing.T, root string) map[string]string {
	t.Helper()
	rows, err := b.pool.Query(t.Context(), `SELECT run_id, state FROM run WHERE run_id = $1 OR root_run_id = $1`, root)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var id, state string
		if err := rows.Scan(&id, &state); err != nil {
			t.Fatal(err)
		}
		out[id] = state
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkNoGrantAfterTheEnd checks, for every run of the tree under root,
// that no reservation was granted on it after the entry that ended it
// (its own 'exhaust' or 'cancel' entry, which the root's end writes on
// every level in its own transaction): each grant locks the run's
// account, as that entry's write does, so their ids are in commit order.
// It returns the depths of the runs that transaction ended.
func (b *testBundle) checkNoGrantAfterTheEnd(t *testing.T, root string) map[int]int {
	t.Helper()
	var rootEnd time.Time
	if err := b.pool.QueryRow(t.Context(), `SELECT created_at FROM ledger_entry
		WHERE run_id = $1 AND kind IN ('exhaust', 'cancel') AND account_id = (SELECT account_id FROM account
		WHERE run_id = $1 AND kind = 'run') ORDER BY entry_id LIMIT 1`, root).Scan(&rootEnd); err != nil {
		t.Fatalf("the root's end entry: %v", err)
	}
	rows, err := b.pool.Query(t.Context(), `
		SELECT r.run_id, r.depth, e.entry_id, e.created_at,
			(SELECT count(*) FROM ledger_entry g WHERE g.run_id = r.run_id AND g.kind = 'reserve' AND g.entry_id > e.entry_id)
		FROM run r
		JOIN account a ON a.run_id = r.run_id AND a.kind = 'run'
		JOIN LATERAL (SELECT entry_id, created_at FROM ledger_entry x
			WHERE x.account_id = a.account_id AND x.kind IN ('exhaust', 'cancel') ORDER BY entry_id LIMIT 1) e ON true
		WHERE r.run_id = $1 OR r.root_run_id = $1`, root)
	if err != nil {
		t.Fatal(err)
	}
	sameTx := map[int]int{}
	for rows.Next() {
		var run string
		var depth int
		var entry, late int64
		var at time.Time
		if err := rows.Scan(&run, &depth, &entry, &at, &late); err != nil {
			t.Fatal(err)
		}
		if late != 0 {
			t.Errorf("run %s: %d reservations granted after its end entry %d", run, late, entry)
		}
		if at.Equal(rootEnd) {
			sameTx[depth]++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return sameTx
}

func TestNestedFanOutExhaustionEndsEveryLevel(t *testing.T) {
	// Not parallel: trees of runs on workers with sims that take their
	// time; beside the package's timing-sensitive tests they starved them.
	b := setup(t)
	sim := llm.SimConfig{Latency: 200 * time.Millisecond, ToolCallsPerIteration: 1, FinishAfter: 40}
	w1, _ := b.worker(t, "w1", sim, 16)
	w2, _ := b.worker(t, "w2", sim, 16)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w1, w2)
	s := exhaustedTreeSpec("tree-exhausted")
	evs := runStream(t, n.client, s)
	fin := checkEvents(t, evs)
	root := evs[0].GetRunId()
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED {
		b.logTree(t, root)
		t.Fatalf("root ended %s (%q), want BUDGET_EXHAUSTED", fin.GetState(), fin.GetCancelCause())
	}
	runsOf := b.treeRuns(t, root)
	if len(runsOf) < 2 {
		t.Fatalf("the tree has %d runs: nothing fanned out before the budget ran out", len(runsOf))
	}
	for id, state := range runsOf {
		if state == "RUNNING" {
			t.Errorf("run %s of the tree is still RUNNING after its root ended", id)
		}
	}
	b.logTree(t, root)
	ended := b.checkNoGrantAfterTheEnd(t, root)
	if ended[0] != 1 || ended[1] == 0 || ended[2] == 0 {
		t.Errorf("runs ended by the root's exhausting transaction, by depth: %v; want the root and runs at depths 1 and 2 "+
			"(t01's child and grandchild were running)", ended)
	}
	t.Logf("%d runs in the tree; runs ended by the root's exhausting transaction, by depth: %v", len(runsOf), ended)
	b.checkLedger(t)
}

// logTree logs every run of the tree under root: its depth, state, spend
// and its tasks' statuses.
func (b *testBundle) logTree(t *testing.T, root string) {
	t.Helper()
	rows, err := b.pool.Query(t.Context(), `SELECT r.depth, r.run_id, r.state, a.limit_tokens, a.spent,
		(SELECT string_agg(task_id || ' ' || status || coalesce(' (' || (outcome->'summary'->>'error') || ')', ''), '; '
			ORDER BY dispatch_index) FROM task WHERE task.run_id = r.run_id)
		FROM run r JOIN account a ON a.run_id = r.run_id AND a.kind = 'run'
		WHERE r.run_id = $1 OR r.root_run_id = $1 ORDER BY r.depth, r.created_at`, root)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var depth int
		var id, state, tasks string
		var limit, spent int64
		if err := rows.Scan(&depth, &id, &state, &limit, &spent, &tasks); err != nil {
			t.Fatal(err)
		}
		t.Logf("%*s%s %s spent %d of %d: %s", 2*depth, "", id[:8], state, spent, limit, tasks)
	}
}

// TestNestedFanOutNeedsNoMoreWorkersThanItsLevels runs the three-level
// tree (18 tasks) on one worker with room for two subagents: each parent
// gives its slot back while it waits for its child, so the children run.
// Held, the four parents would fill it and the tree would wait for its
// deadline.
func TestNestedFanOutNeedsNoMoreWorkersThanItsLevels(t *testing.T) {
	// Not parallel: trees of runs on workers with sims that take their
	// time; beside the package's timing-sensitive tests they starved them.
	b := setup(t)
	w, _ := b.worker(t, "w1", llm.SimConfig{}, 2)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w)

	s := treeSpec("tree-small-worker", 2_000_000)
	s.Limits = &fanoutv1.Limits{RunTimeout: durationpb.New(patience)}
	evs := runStream(t, n.client, s)
	fin := checkEvents(t, evs)
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		b.logTree(t, evs[0].GetRunId())
		t.Fatalf("root ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	if runsOf := b.treeRuns(t, evs[0].GetRunId()); len(runsOf) != 6 {
		t.Errorf("the tree has %d runs, want 6", len(runsOf))
	}
	b.checkLedger(t)
}

// TestNestedFanOutLimitsHold runs the three-level tree under each of
// RunSpec.fan_out's limits set just below what it asks: the tree stops
// at the limit, and the call refused tells its model which limit, by its
// field's name.
func TestNestedFanOutLimitsHold(t *testing.T) {
	// Not parallel: trees of runs on workers with sims that take their
	// time; beside the package's timing-sensitive tests they starved them.
	b := setup(t)
	w1, _ := b.worker(t, "w1", llm.SimConfig{}, 16)
	w2, _ := b.worker(t, "w2", llm.SimConfig{}, 16)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w1, w2)

	for _, tc := range []struct {
		name   string
		fanOut *fanoutv1.FanOut
		runs   int    // the tree's runs, the root's included
		tasks  int    // the tree's tasks, every level's
		field  string // named by a refused call, "" if none is refused
	}{
		// The grandchild's task that asks to fan out a third time is not
		// offered fan_out: the tree has the root and two levels.
		{"depth", &fanoutv1.FanOut{MaxDepth: 2}, 6, 18, ""},
		// t01's child's c3 is not offered fan_out: one level.
		{"depth1", &fanoutv1.FanOut{MaxDepth: 1}, 5, 16, ""},
		// The root's 4 and two children's 3 make 10: the other two are refused.
		{"tree", &fanoutv1.FanOut{MaxDepth: 2, MaxTreeTasks: 10}, 3, 10, "fan_out.max_tree_tasks"},
		// Every call asks for 3.
		{"child", &fanoutv1.FanOut{MaxDepth: 2, MaxChildTasks: 2}, 1, 4, "fan_out.max_child_tasks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := treeSpec("limits-"+tc.name, 2_000_000)
			s.FanOut = tc.fanOut
			s.Tasks[1].Instruction = "study area 1 fan out(part a | part b | part c fan out(detail x | detail y fan out(deeper z)))"
			if tc.name == "tree" {
				// One task at a time, so that which calls are refused is
				// the same every time: t00's and t01's children fit.
				s.Limits = &fanoutv1.Limits{MaxConcurrency: 1}
			}
			evs := runStream(t, n.client, s)
			fin := checkEvents(t, evs)
			root := evs[0].GetRunId()
			if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
				b.logTree(t, root)
				t.Fatalf("root ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
			}
			var runs, tasks int
			if err := b.pool.QueryRow(t.Context(), `SELECT count(DISTINCT r.run_id), count(*) FROM run r JOIN task USING (run_id)
				WHERE r.run_id = $1 OR r.root_run_id = $1`, root).Scan(&runs, &tasks); err != nil {
				t.Fatal(err)
			}
			if runs != tc.runs || tasks != tc.tasks {
				b.logTree(t, root)
				t.Errorf("the tree has %d runs and %d tasks, want %d and %d", runs, tasks, tc.runs, tc.tasks)
			}
			refused := 0
			for _, o := range fin.GetResult().GetTasks() {
				for _, f := range o.GetSummary().GetFailed() {
					if strings.Contains(f, "fan_out") {
						refused++
						if tc.field == "" || !strings.Contains(f, tc.field) {
							t.Errorf("task %s: %q, want a refusal naming %q", o.GetTaskId(), f, tc.field)
						}
					}
				}
			}
			if want := tc.field != ""; want != (refused > 0) {
				t.Errorf("%d refused fan_out calls; want some exactly when a limit refuses one (%q)", refused, tc.field)
			}
		})
	}
	b.checkLedger(t)
}

// TestNestedFanOutUnderATenantsTaskCap runs the three-level tree for a
// tenant capped at two tasks in flight. Each level has a share of its own
// (a task at depth d takes a slot while fewer than (d+1) × 2 are held):
// the parents holding the root level's two slots do not starve their
// children, and the tree ends; at most 2 of the root's tasks and 6 of the
// tree's have a call open at once.
func TestNestedFanOutUnderATenantsTaskCap(t *testing.T) {
	// Not parallel: trees of runs on workers with sims that take their
	// time; beside the package's timing-sensitive tests they starved them.
	b := setup(t)
	sim := llm.SimConfig{Latency: 50 * time.Millisecond}
	w, ws := b.worker(t, "w1", sim, 32)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w)
	b.setQuotas(t, nil, nil, 2)

	s := treeSpec("tree-capped", 2_000_000)
	s.Limits = &fanoutv1.Limits{RunTimeout: durationpb.New(patience)}
	evs := runStream(t, n.client, s)
	fin := checkEvents(t, evs)
	root := evs[0].GetRunId()
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		b.logTree(t, root)
		t.Fatalf("root ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	if runsOf := b.treeRuns(t, root); len(runsOf) != 6 {
		t.Errorf("the tree has %d runs, want 6", len(runsOf))
	}
	var rootCalls []llm.CallRecord
	for _, c := range ws.Calls() {
		if c.RunID == root {
			rootCalls = append(rootCalls, c)
		}
	}
	if most := mostTasksAtOnce(rootCalls); most > 2 {
		t.Errorf("%d of the root's tasks had a call open at once, want at most the cap, 2", most)
	}
	if most := mostTasksAtOnce(ws.Calls()); most > 6 {
		t.Errorf("%d of the tree's tasks had a call open at once, want at most 2 a level, 6", most)
	}
	b.checkLedger(t)
}

// TestAChildOfATaskThatEndedIsCancelled: under JOIN_POLICY_FAIL_FAST a
// task that ends short of an answer (its iteration limit) cuts the run's
// other task, which waits for a child run that searches for a while: the
// child is cancelled with it (nobody will read its answer), its funding
// settles, and the run's spend counts what it spent.
func TestAChildOfATaskThatEndedIsCancelled(t *testing.T) {
	// Not parallel: trees of runs on workers with sims that take their
	// time; beside the package's timing-sensitive tests they starved them.
	b := setup(t)
	sim := llm.SimConfig{Latency: 200 * time.Millisecond, ToolCallsPerIteration: 1, FinishAfter: 20}
	w, _ := b.worker(t, "w1", sim, 16)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w)

	s := spec("fail-fast", 2, 400_000)
	s.JoinPolicy = fanoutv1.JoinPolicy_JOIN_POLICY_FAIL_FAST
	s.FanOut = &fanoutv1.FanOut{MaxDepth: 1}
	// t00 searches and ends at its iteration limit, 4 (about 0.8 s): not
	// an answer, so the run is cut. t01 fans out at its first reply
	// (0.2 s) to two tasks that search for 20 iterations (4 s).
	s.Tasks[0].Instruction = "search for a while"
	s.Tasks[0].AllowedTools = []string{"search"}
	s.Tasks[0].MaxIterations = 4
	s.Tasks[1].Instruction = "study fan out(part a | part b)"
	s.Tasks[1].AllowedTools = []string{"search"}
	s.Tasks[1].MaxIterations = 30
	evs := runStream(t, n.client, s)
	root := evs[0].GetRunId()
	var child string
	for _, ev := range evs {
		if c := ev.GetChildRunStarted(); c != nil {
			child = c.GetChildRunId()
		}
	}
	if child == "" {
		t.Fatalf("task t01 never fanned out before t00's end cut it")
	}
	got, err := n.client.GetRun(t.Context(), &fanoutv1.GetRunRequest{RunId: child})
	if err != nil {
		t.Fatal(err)
	}
	if st := got.GetRun().GetState(); st != fanoutv1.RunState_RUN_STATE_CANCELLED ||
		!strings.Contains(got.GetRun().GetCancelCause(), "parent task ended") {
		t.Errorf("the child of the task the run cut ended %s (%q), want CANCELLED because its parent task ended",
			st, got.GetRun().GetCancelCause())
	}
	b.checkLedger(t)
	var spent, own int64
	if err := b.pool.QueryRow(t.Context(), `SELECT (SELECT spent_tokens FROM run_tree_spend WHERE run_id = $1),
		(SELECT sum(own_spent_tokens) FROM run_tree_spend WHERE root_run_id = $1)`, root).Scan(&spent, &own); err != nil {
		t.Fatal(err)
	}
	if spent != own {
		t.Errorf("the root spent %d; its levels' own spend adds up to %d", spent, own)
	}
}
