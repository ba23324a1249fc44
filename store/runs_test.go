package store_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store"
)

func draftRun(id, tenant, key string, tasks ...string) *fanoutv1.Run {
	r := &fanoutv1.Run{RunId: id, TenantId: tenant, IdempotencyKey: key,
		Spec:   &fanoutv1.RunSpec{IdempotencyKey: key, TenantId: tenant, Goal: "g"},
		Labels: map[string]string{"team": "a"}}
	for i, t := range tasks {
		r.Spec.Tasks = append(r.Spec.Tasks, &fanoutv1.TaskSpec{Id: t, Instruction: "x", TokenBudget: 10})
		r.Tasks = append(r.Tasks, &fanoutv1.TaskOutcome{TaskId: t, DispatchIndex: int32(i)})
	}
	return r
}

func TestRunsCreateIsIdempotent(t *testing.T) {
	b := setup(t)
	rs := store.NewRuns(b.pool)
	r, created, err := rs.CreateRun(b.ctx, draftRun("r1", "ten", "k", "a", "b"), "node1")
	if err != nil || !created {
		t.Fatalf("create: %v, created %v", err, created)
	}
	if r.GetState() != fanoutv1.RunState_RUN_STATE_RUNNING || len(r.GetTasks()) != 2 ||
		r.GetTasks()[1].GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_PENDING || r.GetCreatedAt() == nil ||
		r.GetLabels()["team"] != "a" {
		t.Errorf("created run: %v", r)
	}
	again, created, err := rs.CreateRun(b.ctx, draftRun("r2", "ten", "k", "a", "b"), "node2")
	if err != nil || created || again.GetRunId() != "r1" {
		t.Errorf("same key: run %s, created %v, err %v; want r1, false", again.GetRunId(), created, err)
	}
	// Same key, other tenant: another run.
	if _, created, err := rs.CreateRun(b.ctx, draftRun("r3", "other", "k", "a"), "node1"); err != nil || !created {
		t.Errorf("other tenant: created %v, err %v", created, err)
	}
	if _, err := rs.GetRun(b.ctx, "other", "r1"); !errors.Is(err, runs.ErrNotFound) {
		t.Errorf("GetRun as another tenant: %v, want ErrNotFound", err)
	}
	if !proto.Equal(again.GetSpec(), draftRun("r1", "ten", "k", "a", "b").GetSpec()) {
		t.Error("stored spec differs from the submitted one")
	}
}

func TestRunsEventsHaveNoGaps(t *testing.T) {
	for _, coalesce := range []bool{false, true} {
		t.Run(fmt.Sprint("coalesce=", coalesce), func(t *testing.T) { testEventsHaveNoGaps(t, coalesce) })
	}
}

func testEventsHaveNoGaps(t *testing.T, coalesce bool) {
	b := setup(t)
	rs := store.NewRuns(b.pool, store.RunsConfig{Coalesce: coalesce})
	defer rs.Close()
	if _, _, err := rs.CreateRun(b.ctx, draftRun("r1", "ten", "k", "a"), "n"); err != nil {
		t.Fatal(err)
	}
	// A second run's events interleave in the same batches.
	if _, _, err := rs.CreateRun(b.ctx, draftRun("r2", "ten", "k2", "a"), "n"); err != nil {
		t.Fatal(err)
	}
	const writers, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				for _, run := range []string{"r1", "r2"} {
					_, err := rs.AppendEvent(b.ctx, run, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskQueued{
						TaskQueued: &fanoutv1.TaskQueued{TaskId: fmt.Sprintf("w%d-%d", w, i)}}})
					if err != nil {
						errs <- err
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	evs, err := rs.Events(b.ctx, "ten", "r1", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != writers*each {
		t.Fatalf("%d events, want %d", len(evs), writers*each)
	}
	last := map[string]int{} // each writer's events keep its order
	for i, ev := range evs {
		if ev.GetSequence() != int64(i+1) || ev.GetRunId() != "r1" || ev.GetTime() == nil || ev.GetTaskQueued() == nil {
			t.Fatalf("event %d: %v", i, ev)
		}
		var w, n int
		if _, err := fmt.Sscanf(ev.GetTaskQueued().GetTaskId(), "w%d-%d", &w, &n); err != nil {
			t.Fatal(err)
		}
		if prev, ok := last[fmt.Sprint(w)]; ok && n != prev+1 {
			t.Fatalf("writer %d: event %d follows %d", w, n, prev)
		}
		last[fmt.Sprint(w)] = n
	}
	tail, err := rs.Events(b.ctx, "ten", "r1", 190, 5)
	if err != nil || len(tail) != 5 || tail[0].GetSequence() != 191 {
		t.Errorf("events after 190: %d, %v", len(tail), err)
	}
	if none, err := rs.Events(b.ctx, "other", "r1", 0, 10); err != nil || len(none) != 0 {
		t.Errorf("events as another tenant: %d, %v", len(none), err)
	}
	if _, err := rs.AppendEvent(b.ctx, "nope", &fanoutv1.RunEvent{}); !errors.Is(err, runs.ErrNotFound) {
		t.Errorf("append to unknown run: %v", err)
	}
}

func TestRunsTasksAndFinish(t *testing.T) {
	b := setup(t)
	rs := store.NewRuns(b.pool)
	if _, _, err := rs.CreateRun(b.ctx, draftRun("r1", "ten", "k", "a", "b"), "n"); err != nil {
		t.Fatal(err)
	}
	started, err := rs.StartTask(b.ctx, "r1", "n", &fanoutv1.TaskStarted{TaskId: "a", Worker: "w1"})
	if err != nil || started.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_RUNNING || started.GetStartedAt() == nil {
		t.Fatalf("start: %v, %v", started, err)
	}
	done, err := rs.FinishTask(b.ctx, "r1", "n", &fanoutv1.TaskOutcome{TaskId: "a", Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED,
		TokensSpent: 42, Worker: "w1", Summary: &fanoutv1.FactSummary{Facts: []*fanoutv1.Fact{{Text: "f"}}}})
	if err != nil || done.GetFinishedAt() == nil || done.GetTokensSpent() != 42 || len(done.GetSummary().GetFacts()) != 1 {
		t.Fatalf("finish: %v, %v", done, err)
	}
	if _, err := rs.FinishTask(b.ctx, "r1", "n", &fanoutv1.TaskOutcome{TaskId: "zz", Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED}); !errors.Is(err, runs.ErrNotFound) {
		t.Errorf("finish unknown task: %v", err)
	}
	res := &fanoutv1.JoinedResult{TotalTokens: 42}
	if _, ended, err := rs.FinishRun(b.ctx, "r1", "other", fanoutv1.RunState_RUN_STATE_FAILED, "x", nil); err != nil || ended {
		t.Fatalf("finish by a node that does not own the run: ended %v, %v", ended, err)
	}
	r, ended, err := rs.FinishRun(b.ctx, "r1", "n", fanoutv1.RunState_RUN_STATE_CANCELLED, "cancelled by caller", res)
	if err != nil || !ended || r.GetState() != fanoutv1.RunState_RUN_STATE_CANCELLED || r.GetFinishedAt() == nil ||
		r.GetResult().GetTotalTokens() != 42 || r.GetTasks()[0].GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
		t.Fatalf("finish run: %v, %v", r, err)
	}
	// A second finish changes nothing.
	r2, ended, err := rs.FinishRun(b.ctx, "r1", "n", fanoutv1.RunState_RUN_STATE_SUCCEEDED, "", nil)
	if err != nil || ended || r2.GetState() != fanoutv1.RunState_RUN_STATE_CANCELLED {
		t.Errorf("second finish: %v, ended %v, %v", r2.GetState(), ended, err)
	}
}

func TestRunsListNewestFirst(t *testing.T) {
	b := setup(t)
	rs := store.NewRuns(b.pool)
	for i := range 5 {
		if _, _, err := rs.CreateRun(b.ctx, draftRun(fmt.Sprint("r", i), "ten", fmt.Sprint("k", i), "a"), "n"); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := rs.FinishRun(b.ctx, "r2", "n", fanoutv1.RunState_RUN_STATE_SUCCEEDED, "", &fanoutv1.JoinedResult{}); err != nil {
		t.Fatal(err)
	}
	// Another tenant's run, newest of all: never listed for "ten" (I11).
	if _, _, err := rs.CreateRun(b.ctx, draftRun("other-tenant", "globex", "k9", "a"), "n"); err != nil {
		t.Fatal(err)
	}
	var got []string
	var before time.Time
	var beforeID string
	for {
		page, err := rs.ListRuns(b.ctx, "ten", fanoutv1.RunState_RUN_STATE_UNSPECIFIED, before, beforeID, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, r := range page {
			got = append(got, r.GetRunId())
		}
		last := page[len(page)-1]
		before, beforeID = last.GetCreatedAt().AsTime(), last.GetRunId()
	}
	if fmt.Sprint(got) != "[r4 r3 r2 r1 r0]" {
		t.Errorf("listed %v, want [r4 r3 r2 r1 r0]", got)
	}
	ok, err := rs.ListRuns(b.ctx, "ten", fanoutv1.RunState_RUN_STATE_SUCCEEDED, time.Time{}, "", 10)
	if err != nil || len(ok) != 1 || ok[0].GetRunId() != "r2" {
		t.Errorf("list SUCCEEDED: %d runs, %v", len(ok), err)
	}
}

// TestRunsTerminalOutcomesAreFinal: a task that ended keeps its outcome (a
// replica that lost the run cannot overwrite what the adopter recorded),
// FailTasks ends only unfinished tasks, and a run that ended takes no event
// but its RunFinished.
func TestRunsTerminalOutcomesAreFinal(t *testing.T) {
	for _, coalesce := range []bool{false, true} {
		t.Run(fmt.Sprint("coalesce=", coalesce), func(t *testing.T) { testTerminalOutcomesAreFinal(t, coalesce) })
	}
}

func testTerminalOutcomesAreFinal(t *testing.T, coalesce bool) {
	b := setup(t)
	rs := store.NewRuns(b.pool, store.RunsConfig{Coalesce: coalesce})
	defer rs.Close()
	if _, _, err := rs.CreateRun(b.ctx, draftRun("r1", "ten", "k", "a", "b", "c"), "n"); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.FinishTask(b.ctx, "r1", "n", &fanoutv1.TaskOutcome{TaskId: "a", Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED, TokensSpent: 7}); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.StartTask(b.ctx, "r1", "n", &fanoutv1.TaskStarted{TaskId: "b", Worker: "w1"}); err != nil {
		t.Fatal(err)
	}
	failed, err := rs.FailTasks(b.ctx, "r1", "n", "orchestrator lost")
	if err != nil {
		t.Fatal(err)
	}
	if len(failed) != 2 || failed[0].GetTaskId() != "b" || failed[1].GetTaskId() != "c" {
		t.Fatalf("FailTasks ended %v, want b and c", failed)
	}
	for _, o := range failed {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_FAILED || o.GetSummary().GetError() != "orchestrator lost" || o.GetFinishedAt() == nil {
			t.Errorf("failed task: %v", o)
		}
	}
	if failed[0].GetWorker() != "w1" || failed[0].GetStartedAt() == nil {
		t.Errorf("the running task lost its worker or start: %v", failed[0])
	}
	if _, err := rs.FinishTask(b.ctx, "r1", "n", &fanoutv1.TaskOutcome{TaskId: "b", Status: fanoutv1.TaskStatus_TASK_STATUS_CANCELLED}); !errors.Is(err, runs.ErrEnded) {
		t.Errorf("finish an ended task: %v, want ErrConflict", err)
	}
	if _, err := rs.StartTask(b.ctx, "r1", "n", &fanoutv1.TaskStarted{TaskId: "c", Worker: "w2"}); !errors.Is(err, runs.ErrEnded) {
		t.Errorf("start an ended task: %v, want ErrConflict", err)
	}
	if _, err := rs.StartTask(b.ctx, "r1", "n", &fanoutv1.TaskStarted{TaskId: "zz", Worker: "w2"}); !errors.Is(err, runs.ErrNotFound) {
		t.Errorf("start an unknown task: %v, want ErrNotFound", err)
	}
	r, err := rs.GetRun(b.ctx, "ten", "r1")
	if err != nil || r.GetTasks()[0].GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED || r.GetTasks()[0].GetTokensSpent() != 7 ||
		r.GetTasks()[1].GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_FAILED {
		t.Fatalf("stored tasks: %v, %v", r.GetTasks(), err)
	}
	if again, err := rs.FailTasks(b.ctx, "r1", "n", "again"); err != nil || len(again) != 0 {
		t.Errorf("second FailTasks: %d tasks, %v", len(again), err)
	}

	queued := &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskQueued{TaskQueued: &fanoutv1.TaskQueued{TaskId: "a"}}}
	if _, err := rs.AppendEvent(b.ctx, "r1", queued); err != nil {
		t.Fatal(err)
	}
	if _, ended, err := rs.FinishRun(b.ctx, "r1", "n", fanoutv1.RunState_RUN_STATE_FAILED, "lost", nil); err != nil || !ended {
		t.Fatalf("finish run: ended %v, %v", ended, err)
	}
	if _, err := rs.AppendEvent(b.ctx, "r1", queued); !errors.Is(err, runs.ErrEnded) {
		t.Errorf("event after the run ended: %v, want ErrConflict", err)
	}
	// Each task's start and end wrote its TaskStarted and TaskFinished
	// with it (a ended, b started, b and c ended by FailTasks), and the end
	// is one write: FinishRun stored the RunFinished, the last event; a
	// second one is refused like any other event after the end.
	evs, err := rs.Events(b.ctx, "ten", "r1", 0, 10)
	var finished []string
	for _, ev := range evs {
		if f := ev.GetTaskFinished(); f != nil {
			finished = append(finished, f.GetOutcome().GetTaskId()+"="+runs.Text(f.GetOutcome().GetStatus()))
		}
	}
	if !slices.Equal(finished, []string{"a=SUCCEEDED", "b=FAILED", "c=FAILED"}) {
		t.Errorf("TaskFinished events %v, want a=SUCCEEDED b=FAILED c=FAILED, each written with its outcome", finished)
	}
	if err != nil || len(evs) != 6 || evs[1].GetTaskStarted().GetTaskId() != "b" ||
		evs[5].GetRunFinished().GetState() != fanoutv1.RunState_RUN_STATE_FAILED ||
		evs[5].GetRunFinished().GetCancelCause() != "lost" || evs[5].GetSequence() != 6 {
		t.Errorf("events after FinishRun: %v, %v; want TaskFinished, b's TaskStarted, two TaskFinished, TaskQueued, then RunFinished FAILED \"lost\" at sequence 6", evs, err)
	}
	if _, err := rs.AppendEvent(b.ctx, "r1", &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_RunFinished{RunFinished: &fanoutv1.RunFinished{}}}); !errors.Is(err, runs.ErrEnded) {
		t.Errorf("a second RunFinished after the run ended: %v, want ErrEnded", err)
	}
}

// TestRunsLeases: Heartbeat refreshes only the owner's live runs and names
// the ones another node took; AdoptOrphan takes only stale runs, and of
// many replicas adopting at once exactly one gets each run.
func TestRunsLeases(t *testing.T) {
	b := setup(t)
	rs := store.NewRuns(b.pool)
	for i := range 4 {
		if _, _, err := rs.CreateRun(b.ctx, draftRun(fmt.Sprint("r", i), "ten", fmt.Sprint("k", i), "a"), "dead"); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := rs.CreateRun(b.ctx, draftRun("live", "ten", "kl", "a"), "alive"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := rs.FinishRun(b.ctx, "r3", "dead", fanoutv1.RunState_RUN_STATE_SUCCEEDED, "", nil); err != nil {
		t.Fatal(err)
	}
	// Fresh runs are nobody's orphans.
	if a, err := rs.AdoptOrphan(b.ctx, "x", time.Minute); err != nil || a.RunID != "" {
		t.Fatalf("adopted %q (%v) while every heartbeat is fresh", a.RunID, err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE run SET owner_heartbeat = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	if lost, err := rs.Heartbeat(b.ctx, "alive", []string{"live", "r0", "nope"}); err != nil || len(lost) != 1 || lost[0] != "r0" {
		t.Fatalf("heartbeat: lost %v, %v; want [r0]", lost, err)
	}

	const replicas = 8
	var mu sync.Mutex
	adopted := map[string]string{} // run -> adopter
	var dupes atomic.Int32
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() {
			node := fmt.Sprint("n", i)
			for {
				a, err := rs.AdoptOrphan(b.ctx, node, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				id := a.RunID
				if id == "" {
					return
				}
				if a.PrevOwner != "dead" || a.Adoptions != 1 || a.At.IsZero() {
					t.Errorf("run %s adopted from %q (adoption %d at %v), want from dead, the first, at a time",
						id, a.PrevOwner, a.Adoptions, a.At)
				}
				mu.Lock()
				if _, ok := adopted[id]; ok {
					dupes.Add(1)
				}
				adopted[id] = node
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if dupes.Load() != 0 || len(adopted) != 3 {
		t.Fatalf("adopted %v (%d twice), want r0, r1, r2 once each", adopted, dupes.Load())
	}
	for id, node := range adopted {
		var owner string
		var fresh bool
		if err := b.pool.QueryRow(b.ctx, `SELECT owner, owner_heartbeat > now() - interval '1 minute' FROM run WHERE run_id = $1`, id).
			Scan(&owner, &fresh); err != nil || owner != node || !fresh {
			t.Errorf("run %s: owner %q (adopter %s), fresh %v, %v", id, owner, node, fresh, err)
		}
	}
	// The old owner's writes are fenced: it cannot end the run, nor start
	// or end its tasks; the new owner can.
	if _, ended, err := rs.FinishRun(b.ctx, "r0", "dead", fanoutv1.RunState_RUN_STATE_SUCCEEDED, "", nil); err != nil || ended {
		t.Errorf("the old owner ended an adopted run: %v, %v", ended, err)
	}
	if _, err := rs.StartTask(b.ctx, "r0", "dead", &fanoutv1.TaskStarted{TaskId: "a", Worker: "w1"}); !errors.Is(err, runs.ErrNotOwner) {
		t.Errorf("the old owner started a task of an adopted run: %v, want ErrNotOwner", err)
	}
	if _, err := rs.FinishTask(b.ctx, "r0", "dead", &fanoutv1.TaskOutcome{TaskId: "a",
		Status: fanoutv1.TaskStatus_TASK_STATUS_CANCELLED}); !errors.Is(err, runs.ErrNotOwner) {
		t.Errorf("the old owner ended a task of an adopted run: %v, want ErrNotOwner", err)
	}
	if _, err := rs.StartTask(b.ctx, "r0", adopted["r0"], &fanoutv1.TaskStarted{TaskId: "a", Worker: "w1"}); err != nil {
		t.Errorf("the new owner could not start a task: %v", err)
	}
	if lost, err := rs.Heartbeat(b.ctx, "dead", []string{"r0", "r1", "r3"}); err != nil || len(lost) != 2 {
		t.Errorf("old owner's heartbeat: lost %v, %v; want r0 and r1", lost, err)
	}
	// Each change of hands is counted.
	if _, err := b.pool.Exec(b.ctx, `UPDATE run SET owner_heartbeat = now() - interval '1 hour' WHERE run_id = 'r0'`); err != nil {
		t.Fatal(err)
	}
	if a, err := rs.AdoptOrphan(b.ctx, "n9", time.Minute); err != nil || a.RunID != "r0" || a.Adoptions != 2 || a.PrevOwner != adopted["r0"] {
		t.Errorf("second adoption: %+v, %v; want r0 from %s, adoption 2", a, err, adopted["r0"])
	}
}

// TestRunsAppendEvents: several events in one write get consecutive
// sequences in order, and an ended run takes none.
func TestRunsAppendEvents(t *testing.T) {
	for _, coalesce := range []bool{false, true} {
		t.Run(fmt.Sprint("coalesce=", coalesce), func(t *testing.T) { testAppendEvents(t, coalesce) })
	}
}

func testAppendEvents(t *testing.T, coalesce bool) {
	b := setup(t)
	rs := store.NewRuns(b.pool, store.RunsConfig{Coalesce: coalesce})
	defer rs.Close()
	if _, _, err := rs.CreateRun(b.ctx, draftRun("r1", "ten", "k", "a"), "n"); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.AppendEvent(b.ctx, "r1", &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskQueued{TaskQueued: &fanoutv1.TaskQueued{TaskId: "first"}}}); err != nil {
		t.Fatal(err)
	}
	var evs []*fanoutv1.RunEvent
	for i := range 5 {
		evs = append(evs, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskQueued{TaskQueued: &fanoutv1.TaskQueued{TaskId: fmt.Sprint("t", i), DispatchIndex: int32(i)}}})
	}
	out, err := rs.AppendEvents(b.ctx, "r1", evs)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := rs.Events(b.ctx, "ten", "r1", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 5 || len(stored) != 6 {
		t.Fatalf("returned %d, stored %d events; want 5 and 6", len(out), len(stored))
	}
	for i, ev := range out {
		if ev.GetSequence() != int64(i+2) || stored[i+1].GetTaskQueued().GetTaskId() != fmt.Sprint("t", i) {
			t.Errorf("event %d: returned %v, stored %v", i, ev, stored[i+1])
		}
	}
	if _, err := rs.AppendEvents(b.ctx, "nope", evs); !errors.Is(err, runs.ErrNotFound) {
		t.Errorf("append to an unknown run: %v", err)
	}
}

// TestRunsAppendEventsConcurrently: AppendEvent and AppendEvents go one way;
// with writers on two runs at once (sharing batches when coalescing), every
// call's events are consecutive and in order, as returned and as stored, and
// each run's history has no gaps. Once the run has ended, a call is taken
// only if all its events are RunFinished, all or none.
func TestRunsAppendEventsConcurrently(t *testing.T) {
	for _, coalesce := range []bool{false, true} {
		t.Run(fmt.Sprint("coalesce=", coalesce), func(t *testing.T) { testAppendEventsConcurrently(t, coalesce) })
	}
}

func testAppendEventsConcurrently(t *testing.T, coalesce bool) {
	b := setup(t)
	rs := store.NewRuns(b.pool, store.RunsConfig{Coalesce: coalesce})
	defer rs.Close()
	for _, id := range []string{"r1", "r2"} {
		if _, _, err := rs.CreateRun(b.ctx, draftRun(id, "ten", "k"+id, "a"), "n"); err != nil {
			t.Fatal(err)
		}
	}
	queued := func(id string) *fanoutv1.RunEvent {
		return &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskQueued{TaskQueued: &fanoutv1.TaskQueued{TaskId: id}}}
	}
	const writers, calls, width = 6, 10, 3
	var wg sync.WaitGroup
	var mu sync.Mutex
	returned := map[string]map[int64]string{"r1": {}, "r2": {}} // run -> sequence -> task id
	for w := range writers {
		wg.Go(func() {
			for c := range calls {
				run := []string{"r1", "r2"}[(w+c)%2]
				var evs []*fanoutv1.RunEvent
				for k := range width {
					evs = append(evs, queued(fmt.Sprintf("w%d-c%d-%d", w, c, k)))
				}
				out, err := rs.AppendEvents(b.ctx, run, evs)
				if err != nil {
					t.Error(err)
					return
				}
				one, err := rs.AppendEvent(b.ctx, run, queued(fmt.Sprintf("w%d-c%d-single", w, c)))
				if err != nil {
					t.Error(err)
					return
				}
				out = append(out, one)
				mu.Lock()
				for k, ev := range out[:width] {
					if ev.GetSequence() != out[0].GetSequence()+int64(k) || ev.GetRunId() != run || ev.GetTime() == nil {
						t.Errorf("call w%d-c%d on %s: event %d is %v, want sequence %d", w, c, run, k, ev, out[0].GetSequence()+int64(k))
					}
				}
				for _, ev := range out {
					returned[run][ev.GetSequence()] = ev.GetTaskQueued().GetTaskId()
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	total := 0
	for _, run := range []string{"r1", "r2"} {
		stored, err := rs.Events(b.ctx, "ten", run, 0, 10000)
		if err != nil {
			t.Fatal(err)
		}
		total += len(stored)
		if len(stored) != len(returned[run]) {
			t.Errorf("%s: %d events stored, %d returned", run, len(stored), len(returned[run]))
		}
		for i, ev := range stored {
			if ev.GetSequence() != int64(i+1) || returned[run][ev.GetSequence()] != ev.GetTaskQueued().GetTaskId() {
				t.Fatalf("%s: stored event %d is %v, returned as %q", run, i, ev, returned[run][ev.GetSequence()])
			}
		}
	}
	if want := writers * calls * (width + 1); total != want {
		t.Errorf("%d events stored, want %d", total, want)
	}

	if _, ended, err := rs.FinishRun(b.ctx, "r1", "n", fanoutv1.RunState_RUN_STATE_SUCCEEDED, "", nil); err != nil || !ended {
		t.Fatalf("finish run: ended %v, %v", ended, err)
	}
	finished := &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_RunFinished{RunFinished: &fanoutv1.RunFinished{}}}
	before, err := rs.Events(b.ctx, "ten", "r1", 0, 10000)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rs.AppendEvents(b.ctx, "r1", []*fanoutv1.RunEvent{queued("late"), finished}); !errors.Is(err, runs.ErrEnded) {
		t.Errorf("a late event with a RunFinished after the run ended: %v, want ErrEnded", err)
	}
	if _, err := rs.AppendEvents(b.ctx, "r1", []*fanoutv1.RunEvent{queued("late"), queued("later")}); !errors.Is(err, runs.ErrEnded) {
		t.Errorf("late events after the run ended: %v, want ErrEnded", err)
	}
	// FinishRun wrote the RunFinished, the last event: another is refused.
	if last := before[len(before)-1]; last.GetRunFinished() == nil {
		t.Errorf("the last event after FinishRun is %v, want its RunFinished", last)
	}
	if _, err := rs.AppendEvents(b.ctx, "r1", []*fanoutv1.RunEvent{finished}); !errors.Is(err, runs.ErrEnded) {
		t.Errorf("a second RunFinished after the run ended: %v, want ErrEnded", err)
	}
	if _, err := rs.AppendEvents(b.ctx, "nope", []*fanoutv1.RunEvent{queued("x")}); !errors.Is(err, runs.ErrNotFound) {
		t.Errorf("append to an unknown run: %v, want ErrNotFound", err)
	}
}
