package store_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
)

// syncBuffer is a log sink shared by goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestHeartbeatDoesNotDeadlockTaskWrites: an orchestrator's heartbeat of
// many runs, while its group commits start those runs' tasks and append
// their events in batches across the runs, takes the run rows in the
// batches' order (run id), so that no transaction deadlocks: a deadlock
// fails a whole batch of other runs' starts and appends, which queue up
// again behind it (issue 44: starts that ran out of time and lost their
// TaskStarted). Every task started has exactly one TaskStarted.
func TestHeartbeatDoesNotDeadlockTaskWrites(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var log syncBuffer
	rs := store.NewRuns(b.pool, store.RunsConfig{Coalesce: true, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	t.Cleanup(rs.Close)
	const nRuns, nTasks = 40, 25
	var runIDs []string
	for r := nRuns - 1; r >= 0; r-- { // stored in the reverse of id order
		var ids []string
		for i := range nTasks {
			ids = append(ids, fmt.Sprintf("t%02d", i))
		}
		id := fmt.Sprintf("r%02d", r)
		runIDs = append(runIDs, id)
		if _, _, err := rs.CreateRun(b.ctx, draftRun(id, "ten", "k"+id, ids...), "me"); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan struct{})
	beats := make(chan error, 1)
	go func() {
		var err error
		for n := 0; err == nil; n++ {
			select {
			case <-done:
				beats <- nil
				return
			default:
			}
			ids := slices.Clone(runIDs)
			if n%2 == 1 {
				slices.Reverse(ids)
			}
			_, err = rs.Heartbeat(b.ctx, "me", ids)
		}
		beats <- err
	}()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for r := range nRuns {
		for i := range nTasks {
			run, task := fmt.Sprintf("r%02d", r), fmt.Sprintf("t%02d", i)
			wg.Go(func() {
				_, err := rs.StartTask(b.ctx, run, "me", &fanoutv1.TaskStarted{TaskId: task, Worker: "w"})
				if err == nil {
					_, err = rs.AppendEvent(b.ctx, run, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskIteration{
						TaskIteration: &fanoutv1.TaskIteration{TaskId: task, Iteration: 1}}})
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("%s/%s: %w", run, task, err))
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	close(done)
	if err := <-beats; err != nil {
		t.Errorf("heartbeat: %v", err)
	}
	for _, err := range errs {
		t.Error(err)
	}
	for _, line := range strings.Split(log.String(), "\n") {
		if strings.Contains(line, "sqlstate=40P01") {
			t.Errorf("a transaction deadlocked: %s", line)
		}
	}
	var bad int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM task t
		WHERE t.started_at IS NULL OR (SELECT count(*) FROM run_event e
			WHERE e.run_id = t.run_id AND e.event->'task_started'->>'task_id' = t.task_id) <> 1`).Scan(&bad); err != nil {
		t.Fatal(err)
	}
	if bad != 0 {
		t.Errorf("%d tasks not started once with one TaskStarted each", bad)
	}
}
