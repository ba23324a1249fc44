package store_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store"
)

// TestCoalescedFinishTasks: with group commit, the tasks that end together
// end in shared transactions: 40 tasks of a run, ended at once, each end
// once with its outcome and database times and exactly one TaskFinished
// event, the run's events numbered without a gap; in the same burst, ends
// of another replica's run are refused ErrNotOwner, and a task that had
// ended already is refused ErrEnded, without failing the others.
func TestCoalescedFinishTasks(t *testing.T) {
	b := setup(t)
	rs := store.NewRuns(b.pool, store.RunsConfig{Coalesce: true})
	t.Cleanup(rs.Close)
	var ids []string
	for i := range 40 {
		ids = append(ids, fmt.Sprintf("t%02d", i))
	}
	if _, _, err := rs.CreateRun(b.ctx, draftRun("r", "ten", "k1", append(ids, "done")...), "me"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := rs.CreateRun(b.ctx, draftRun("other", "ten", "k2", "x", "y"), "them"); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.FinishTask(b.ctx, "r", "me", &fanoutv1.TaskOutcome{TaskId: "done",
		Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	outs := make([]*fanoutv1.TaskOutcome, len(ids))
	errs := make([]error, len(ids))
	for i, id := range ids {
		wg.Go(func() {
			outs[i], errs[i] = rs.FinishTask(b.ctx, "r", "me", &fanoutv1.TaskOutcome{TaskId: id,
				Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED, TokensSpent: int64(i), Worker: "w"})
		})
	}
	var stale [2]error
	for k, id := range []string{"x", "y"} {
		wg.Go(func() {
			_, stale[k] = rs.FinishTask(b.ctx, "other", "me", &fanoutv1.TaskOutcome{TaskId: id,
				Status: fanoutv1.TaskStatus_TASK_STATUS_CANCELLED})
		})
	}
	var again error
	wg.Go(func() {
		_, again = rs.FinishTask(b.ctx, "r", "me", &fanoutv1.TaskOutcome{TaskId: "done",
			Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED})
	})
	wg.Wait()
	for i, err := range errs {
		if err != nil || outs[i].GetTokensSpent() != int64(i) || outs[i].GetFinishedAt() == nil ||
			outs[i].GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			t.Errorf("FinishTask %s: %v, %v; want it ended with its outcome and a finished_at", ids[i], outs[i], err)
		}
	}
	for k, err := range stale {
		if !errors.Is(err, runs.ErrNotOwner) {
			t.Errorf("FinishTask of another replica's run (%d): %v, want ErrNotOwner", k, err)
		}
	}
	if !errors.Is(again, runs.ErrEnded) {
		t.Errorf("FinishTask of an ended task: %v, want ErrEnded", again)
	}
	var n, distinct, first, last int64
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*), count(DISTINCT event->'task_finished'->'outcome'->>'task_id'),
			min(sequence), max(sequence)
		FROM run_event WHERE run_id = 'r' AND event ? 'task_finished'`).Scan(&n, &distinct, &first, &last); err != nil {
		t.Fatal(err)
	}
	if n != 41 || distinct != 41 || first != 1 || last != 41 {
		t.Errorf("run r has %d TaskFinished events for %d tasks, sequences %d..%d; want 41 for 41, 1..41", n, distinct, first, last)
	}
	var ended int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM task WHERE run_id = 'other' AND status <> 'PENDING'`).Scan(&ended); err != nil || ended != 0 {
		t.Errorf("another replica's run has %d tasks ended (%v); want none", ended, err)
	}
}

// TestCoalescedStartTasks: with group commit, the tasks that start
// together start in shared transactions, each with exactly one TaskStarted
// event in the same write, the run's events numbered without a gap; a
// task started again is news, on another worker or on the same one (an
// adopter may dispatch it to the worker the lost owner had: its start must
// be told); only a try after a lost reply appends nothing twice
// (TestRunWritesWhoseReplyIsLost); in the same burst, another replica's run
// and an ended task are refused.
func TestCoalescedStartTasks(t *testing.T) {
	b := setup(t)
	rs := store.NewRuns(b.pool, store.RunsConfig{Coalesce: true})
	t.Cleanup(rs.Close)
	var ids []string
	for i := range 40 {
		ids = append(ids, fmt.Sprintf("t%02d", i))
	}
	if _, _, err := rs.CreateRun(b.ctx, draftRun("r", "ten", "k1", append(ids, "done")...), "me"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := rs.CreateRun(b.ctx, draftRun("other", "ten", "k2", "x"), "them"); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.FinishTask(b.ctx, "r", "me", &fanoutv1.TaskOutcome{TaskId: "done",
		Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED}); err != nil {
		t.Fatal(err)
	}
	start := func(runID, task, worker string) (*fanoutv1.TaskOutcome, error) {
		return rs.StartTask(b.ctx, runID, "me", &fanoutv1.TaskStarted{TaskId: task, Worker: worker, ForecastTokens: 7})
	}
	var wg sync.WaitGroup
	outs := make([]*fanoutv1.TaskOutcome, len(ids))
	errs := make([]error, len(ids))
	for i, id := range ids {
		wg.Go(func() { outs[i], errs[i] = start("r", id, "w1") })
	}
	var stale, ended error
	wg.Go(func() { _, stale = start("other", "x", "w1") })
	wg.Go(func() { _, ended = start("r", "done", "w1") })
	wg.Wait()
	for i, err := range errs {
		if err != nil || outs[i].GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_RUNNING || outs[i].GetStartedAt() == nil {
			t.Errorf("StartTask %s: %v, %v; want RUNNING with a started_at", ids[i], outs[i], err)
		}
	}
	if !errors.Is(stale, runs.ErrNotOwner) || !errors.Is(ended, runs.ErrEnded) {
		t.Errorf("StartTask of another replica's run: %v (want ErrNotOwner); of an ended task: %v (want ErrEnded)", stale, ended)
	}
	if _, err := start("r", "t00", "w1"); err != nil { // dispatched anew, to the same worker
		t.Fatal(err)
	}
	if _, err := start("r", "t01", "w2"); err != nil { // dispatched anew
		t.Fatal(err)
	}
	var n, distinct, first, last int64
	var forecast7 bool
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*), count(DISTINCT event->'task_started'->>'task_id'),
			min(sequence), max(sequence), bool_and((event->'task_started'->>'forecast_tokens')::bigint = 7)
		FROM run_event WHERE run_id = 'r' AND event ? 'task_started'`).Scan(&n, &distinct, &first, &last, &forecast7); err != nil {
		t.Fatal(err)
	}
	// Sequence 1 is done's TaskFinished.
	if n != 42 || distinct != 40 || first != 2 || last != 43 || !forecast7 {
		t.Errorf("run r has %d TaskStarted events for %d tasks, sequences %d..%d, forecasts kept %v; "+
			"want 42 (40, then t00 again on w1 and t01 on w2) for 40, 2..43, kept", n, distinct, first, last, forecast7)
	}
}
