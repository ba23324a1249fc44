package orchestrator_test

import (
	"fmt"
	"strings"
	"testing"

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
		own, spent, sum int64
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
