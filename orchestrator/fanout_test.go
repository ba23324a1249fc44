package orchestrator_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

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
	t.Parallel()
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
		if ev.GetChildRunStarted() != nil {
			started++
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
		runs            int
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
	all := levels[0].own + levels[1].own + levels[2].own
	if acct.Spent != all || fin.GetResult().GetTotalTokens() != acct.Spent {
		t.Errorf("root spent %d (result total %d); its levels' own spend adds up to %d", acct.Spent,
			fin.GetResult().GetTotalTokens(), all)
	}
	t.Logf("levels: 0 %+v, 1 %+v, 2 %+v; root spent %d; %d facts, %d of the grandchildren", *levels[0], *levels[1], *levels[2],
		acct.Spent, len(fin.GetResult().GetFacts()), grand)
	b.checkLedger(t)
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
	t.Parallel()
	b := setup(t)
	sim := llm.SimConfig{Latency: 200 * time.Millisecond, ToolCallsPerIteration: 1, FinishAfter: 6}
	w1, _ := b.worker(t, "w1", sim, 16)
	w2, _ := b.worker(t, "w2", sim, 16)
	n := b.orchestrator(t, "o1", orchestrator.Config{}, w1, w2)

	// t00 fans out to three quick tasks, and ends. t01 fans out to three
	// that search, an iteration every 200 ms, one of which fans out again
	// to two that search: its tree runs for about two seconds. t02 and
	// t03 search too, once t00 has ended, spending the root's own budget:
	// the root has enough for both fundings, t00 and little more, and runs
	// out while t01's tree runs, its grandchild included.
	s := treeSpec("tree-exhausted", 34_000)
	s.Tasks[0].TokenBudget = 4_000
	s.Tasks[1].TokenBudget = 28_000
	s.Tasks[1].AllowedTools = []string{"search"}
	for _, task := range s.Tasks[2:] {
		task.TokenBudget = 10_000
		task.Instruction = "search " + task.GetId()
		task.AllowedTools = []string{"search"}
		task.DependsOn = []string{"t00"}
	}
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
