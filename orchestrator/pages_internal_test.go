package orchestrator

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// bigRun is an ended run of n one-call tasks, each with one fact of its
// own, as the store returns it: the shape that outgrew gRPC's 4 MiB.
func bigRun(n int) *fanoutv1.Run {
	spec := &fanoutv1.RunSpec{IdempotencyKey: "big", Goal: "find facts"}
	r := &fanoutv1.Run{RunId: "run-big", TenantId: "ten", State: fanoutv1.RunState_RUN_STATE_SUCCEEDED, Spec: spec}
	for i := range n {
		id := fmt.Sprintf("t%05d", i)
		spec.Tasks = append(spec.Tasks, &fanoutv1.TaskSpec{Id: id, Instruction: "look up item " + id + " in the corpus and say what it holds", TokenBudget: 1000})
		r.Tasks = append(r.Tasks, &fanoutv1.TaskOutcome{TaskId: id, DispatchIndex: int32(i), //nolint:gosec // a test's n
			Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED, TokensSpent: 321, Worker: "127.0.0.1:40001",
			Summary: &fanoutv1.FactSummary{Facts: []*fanoutv1.Fact{{Text: "the sim model found the item asked for by task " + id,
				Sources: []string{"sim://corpus/" + id}}},
				Tried: []string{"searched the corpus for " + id, "read the page of " + id}, TokensSpent: 321, Iterations: 1, Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED}})
	}
	r.Result = join(r.Tasks)
	return r
}

func decodeRunPage(t *testing.T, token string) runPage {
	t.Helper()
	var p runPage
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err == nil {
		err = json.Unmarshal(raw, &p)
	}
	if err != nil {
		t.Fatalf("token %q: %v", token, err)
	}
	return p
}

// TestFittingAtTheBoundary: a list that takes exactly the bytes it may is
// kept whole; one byte less and its last item is cut (not split, not
// kept).
func TestFittingAtTheBoundary(t *testing.T) {
	t.Parallel()
	facts := []*fanoutv1.Fact{{Text: "a"}, {Text: strings.Repeat("b", 200)}, {Text: strings.Repeat("c", 70_000)}}
	sum := 0
	for i, f := range facts {
		sum += elemBytes(f)
		if got := fitting(facts, sum); got != i+1 {
			t.Errorf("fitting in %d bytes (exactly %d items): %d", sum, i+1, got)
		}
		if got := fitting(facts, sum-1); got != i {
			t.Errorf("fitting in %d bytes (one short of %d items): %d", sum-1, i+1, got)
		}
	}
	// What elemBytes counts is what the encoding takes.
	if got := proto.Size(&fanoutv1.JoinedResult{Facts: facts}); got != sum {
		t.Errorf("encoded facts: %d bytes, elemBytes sums %d", got, sum)
	}
}

// TestListPageAtTheBoundary: a ListRunTasks page whose items take exactly
// pageItemBytes holds them all; one more byte of them and the page ends an
// item early, with a token for the item it cut.
func TestListPageAtTheBoundary(t *testing.T) {
	t.Parallel()
	// Three facts of sizes that sum to exactly pageItemBytes.
	const small = 1000
	facts := []*fanoutv1.Fact{{Text: strings.Repeat("x", small)}, {Text: strings.Repeat("y", small)}, {}}
	rest := pageItemBytes - elemBytes(facts[0]) - elemBytes(facts[1])
	for n := rest - 8; ; n++ { // the text's length whose element takes rest bytes
		facts[2].Text = strings.Repeat("z", n)
		if elemBytes(facts[2]) == rest {
			break
		}
		if elemBytes(facts[2]) > rest {
			t.Fatalf("no text makes an element of %d bytes", rest)
		}
	}
	page, next := listPage(facts, 0, 3, rpcListRunFacts, "ten", "r")
	if len(page) != 3 || next != "" {
		t.Errorf("items of exactly %d bytes: a page of %d, next %q; want all 3 and no token", pageItemBytes, len(page), next)
	}
	resp := &fanoutv1.ListRunFactsResponse{Facts: page, FactCount: 3, NextPageToken: next}
	if proto.Size(resp) > MaxResponseBytes {
		t.Errorf("the page is %d bytes, over %d", proto.Size(resp), MaxResponseBytes)
	}
	facts[2].Text += "z" // one byte over
	page, next = listPage(facts, 0, 3, rpcListRunFacts, "ten", "r")
	if len(page) != 2 || next == "" || decodeRunPage(t, next).Next != 2 {
		t.Errorf("items one byte over: a page of %d, next %q; want 2 and a token for the third", len(page), next)
	}
	// A page always moves on: an item over the cap on its own is served
	// alone.
	facts[0].Text = strings.Repeat("w", MaxResponseBytes)
	if page, next := listPage(facts, 0, 3, rpcListRunFacts, "ten", "r"); len(page) != 1 || decodeRunPage(t, next).Next != 1 {
		t.Errorf("an item over the cap: a page of %d, next %q; want it alone", len(page), next)
	}
}

// TestCutRunUnderTheCap: a run of 10,000 tasks is served under
// MaxResponseBytes (GetRun, CancelRun, RunStarted, RunFinished), with the
// counts and the tokens of the rest; paging from those tokens gives every
// task and fact exactly once, in order.
func TestCutRunUnderTheCap(t *testing.T) {
	t.Parallel()
	full := bigRun(10_000)
	if n := proto.Size(full); n <= 4<<20 {
		t.Fatalf("the run is %d bytes whole; the test wants one over gRPC's 4 MiB", n)
	}
	served := proto.CloneOf(full)
	cutRun(served, "ten")
	if n := proto.Size(&fanoutv1.GetRunResponse{Run: served}); n > MaxResponseBytes {
		t.Errorf("GetRun of 10,000 tasks: %d bytes, over %d", n, MaxResponseBytes)
	}
	if served.GetTaskCount() != 10_000 || served.GetResult().GetTaskCount() != 10_000 || served.GetResult().GetFactCount() != 10_000 {
		t.Errorf("counts: run %d, result tasks %d, facts %d; want 10,000 each", served.GetTaskCount(),
			served.GetResult().GetTaskCount(), served.GetResult().GetFactCount())
	}
	if !served.GetSpecCut() || len(served.GetSpec().GetTasks()) == 0 || len(served.GetSpec().GetTasks()) == 10_000 {
		t.Errorf("spec: cut %v with %d tasks; want cut to some", served.GetSpecCut(), len(served.GetSpec().GetTasks()))
	}
	pageAll := func(items []*fanoutv1.TaskOutcome, have int, token, rpc string) []*fanoutv1.TaskOutcome {
		out := append([]*fanoutv1.TaskOutcome(nil), items[:have]...)
		for token != "" {
			p := decodeRunPage(t, token)
			if p.RPC != rpc || p.RunID != "run-big" || p.Tenant != "ten" {
				t.Fatalf("token %+v; want %s's of ten's run-big", p, rpc)
			}
			var page []*fanoutv1.TaskOutcome
			page, token = listPage(items[p.Next:min(p.Next+maxRunPage, len(items))], p.Next, len(items), rpc, "ten", "run-big")
			if n := proto.Size(&fanoutv1.ListRunTasksResponse{Tasks: page, NextPageToken: token, TaskCount: 10_000}); n > MaxResponseBytes {
				t.Errorf("a page of %d tasks: %d bytes", len(page), n)
			}
			out = append(out, page...)
		}
		return out
	}
	for name, got := range map[string][]*fanoutv1.TaskOutcome{
		"Run.tasks":    pageAll(full.GetTasks(), len(served.GetTasks()), served.GetTasksNextPageToken(), rpcListRunTasks),
		"result.tasks": pageAll(full.GetTasks(), len(served.GetResult().GetTasks()), served.GetResult().GetTasksNextPageToken(), rpcListRunTasks),
	} {
		if len(got) != 10_000 {
			t.Errorf("%s paged: %d tasks, want 10,000", name, len(got))
			continue
		}
		for i, o := range got {
			if int(o.GetDispatchIndex()) != i {
				t.Errorf("%s paged: task %d is %s", name, i, o.GetTaskId())
				break
			}
		}
	}
	facts := append([]*fanoutv1.Fact(nil), served.GetResult().GetFacts()...)
	for token := served.GetResult().GetFactsNextPageToken(); token != ""; {
		var page []*fanoutv1.Fact
		all, from := full.GetResult().GetFacts(), decodeRunPage(t, token).Next
		page, token = listPage(all[from:min(from+maxRunPage, len(all))], from, len(all), rpcListRunFacts, "ten", "run-big")
		facts = append(facts, page...)
	}
	if len(facts) != 10_000 || !proto.Equal(&fanoutv1.JoinedResult{Facts: facts}, &fanoutv1.JoinedResult{Facts: full.GetResult().GetFacts()}) {
		t.Errorf("facts paged: %d, not the result's 10,000 in order", len(facts))
	}

	// The events: cut on a copy, the shared event left whole.
	for _, ev := range []*fanoutv1.RunEvent{
		{RunId: "run-big", Event: &fanoutv1.RunEvent_RunStarted{RunStarted: &fanoutv1.RunStarted{Run: proto.CloneOf(full)}}},
		{RunId: "run-big", Event: &fanoutv1.RunEvent_RunFinished{RunFinished: &fanoutv1.RunFinished{Result: proto.CloneOf(full.GetResult())}}},
	} {
		before := proto.Size(ev)
		out := servedEvent(ev, "ten")
		if n := proto.Size(&fanoutv1.WatchRunResponse{Event: out}); n > MaxResponseBytes {
			t.Errorf("%T served: %d bytes", ev.GetEvent(), n)
		}
		if proto.Size(ev) != before {
			t.Errorf("%T: servedEvent changed the shared event", ev.GetEvent())
		}
	}
}

// TestCutSpecLeavesOutAHugeGoal: a spec whose goal alone passes its share
// is left out, and said to be.
func TestCutSpecLeavesOutAHugeGoal(t *testing.T) {
	t.Parallel()
	r := &fanoutv1.Run{RunId: "r", Spec: &fanoutv1.RunSpec{Goal: strings.Repeat("g", 3<<20),
		Tasks: []*fanoutv1.TaskSpec{{Id: "t", Instruction: "x", TokenBudget: 1}}},
		Tasks: []*fanoutv1.TaskOutcome{{TaskId: "t"}}}
	cutRun(r, "ten")
	if r.GetSpec() != nil || !r.GetSpecCut() || r.GetTaskCount() != 1 || len(r.GetTasks()) != 1 {
		t.Errorf("run with a 3 MiB goal served: spec %v cut %v, %d of %d tasks", r.GetSpec() != nil, r.GetSpecCut(),
			len(r.GetTasks()), r.GetTaskCount())
	}
	if n := proto.Size(r); n > MaxResponseBytes {
		t.Errorf("served: %d bytes", n)
	}
}

// TestCancelOnlyKeyGetsNoPageToken: CancelRun's answer to a key without
// read scope is the run's summary, cut to fit, with its task count and no
// token: the token's ListRunTasks would be refused to that key (and would
// hand it the summaries the cut left out), so `fanout cancel --json` with a
// cancel-only key failed after the cancel had succeeded. A key that may
// read gets the token.
func TestCancelOnlyKeyGetsNoPageToken(t *testing.T) {
	t.Parallel()
	for _, readable := range []bool{false, true} {
		r := bigRun(20000)
		cancelView(r, "ten", readable)
		if r.GetTaskCount() != 20000 || len(r.GetTasks()) == 20000 {
			t.Fatalf("readable %v: %d of %d tasks served, want a cut run", readable, len(r.GetTasks()), r.GetTaskCount())
		}
		if got := r.GetTasksNextPageToken() != ""; got != readable {
			t.Errorf("readable %v: a page token: %v, want %v", readable, got, readable)
		}
		if !readable && (r.GetSpec() != nil || r.GetResult() != nil || r.GetTasks()[0].GetSummary() != nil) {
			t.Errorf("a cancel-only key was served the run's spec, result or summaries")
		}
	}
}
