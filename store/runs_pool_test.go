package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/store"
)

// TestFinishTaskRefusalsDoNotExhaustThePool: a replica that lost its run
// (adopted while it was paused) has many tasks refused at once. A refused
// FinishTask must hold one connection, not two (its transaction and a
// re-read beside it): with a pool of 2 and 4 refusals at a time, every
// call still answers ErrNotOwner at once instead of waiting out its
// deadline for a connection.
func TestFinishTaskRefusalsDoNotExhaustThePool(t *testing.T) {
	b := setup(t)
	pool, err := store.OpenPool(b.ctx, b.url, store.PoolConfig{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	rs := store.NewRuns(pool)
	tasks := []string{"a", "b", "c", "d"}
	if _, _, err := rs.CreateRun(b.ctx, draftRun("r", "ten", "k", tasks...), "old"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE run SET owner = 'new'`); err != nil { // adopted
		t.Fatal(err)
	}
	for round := range 20 {
		ctx, cancel := context.WithTimeout(b.ctx, 3*time.Second)
		var wg sync.WaitGroup
		errs := make([]error, len(tasks))
		for i, id := range tasks {
			wg.Go(func() {
				_, errs[i] = rs.FinishTask(ctx, "r", "old", &fanoutv1.TaskOutcome{TaskId: id,
					Status: fanoutv1.TaskStatus_TASK_STATUS_CANCELLED})
			})
		}
		wg.Wait()
		cancel()
		for i, err := range errs {
			if !errors.Is(err, runs.ErrNotOwner) {
				t.Fatalf("round %d: FinishTask %s: %v, want ErrNotOwner", round, tasks[i], err)
			}
		}
	}
}
