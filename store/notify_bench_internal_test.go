package store

import (
	"fmt"
	"sync"
	"testing"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store/storetest"
)

// BenchmarkAppendNotify measures what the NOTIFY of each append costs
// (appendSQL's notifyHeadSQL): PostgreSQL queues a transaction's
// notifications under one lock taken at commit, so every notifying commit
// of the database waits for the one before it. clients append one event
// at a time, each to a run of its own (no run row is shared: only the
// notify lock is), with and without the NOTIFY, one transaction per
// append (inline) and with group commit, while a Notifier listens (as
// every node's does). It reports appends a second.
//
//	go test ./store -run '^$' -bench BenchmarkAppendNotify -benchtime 4000x
func BenchmarkAppendNotify(b *testing.B) {
	for _, coalesce := range []bool{false, true} {
		for _, notify := range []bool{false, true} {
			b.Run(fmt.Sprintf("coalesce=%v/notify=%v", coalesce, notify), func(b *testing.B) {
				benchAppend(b, 32, coalesce, notify)
			})
		}
	}
}

func benchAppend(b *testing.B, clients int, coalesce, notify bool) {
	url := storetest.NodeURL(b, storetest.NewDB(b))
	pool, err := OpenPool(b.Context(), url, PoolConfig{MaxConns: int32(clients)})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	// A process listening, as every node does: the notifications are
	// delivered, and read.
	storetest.Background(b, NewNotifier(url, NotifierConfig{}).Run)
	rs := NewRuns(pool, RunsConfig{Coalesce: coalesce})
	defer rs.Close()
	if !notify {
		rs.notices = nil
	}
	for c := range clients {
		run := &fanoutv1.Run{RunId: fmt.Sprint("r", c), TenantId: "ten", IdempotencyKey: fmt.Sprint("k", c),
			Spec: &fanoutv1.RunSpec{IdempotencyKey: fmt.Sprint("k", c), TenantId: "ten", Goal: "g"}}
		if _, _, err := rs.CreateRun(b.Context(), run, "n"); err != nil {
			b.Fatal(err)
		}
	}
	ev := &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskQueued{TaskQueued: &fanoutv1.TaskQueued{TaskId: "t"}}}
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	b.ResetTimer()
	start := time.Now()
	for c := range clients {
		n := b.N / clients
		if c < b.N%clients {
			n++
		}
		wg.Go(func() {
			for range n {
				if _, err := rs.AppendEvent(b.Context(), fmt.Sprint("r", c), ev); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/took.Seconds(), "appends/s")
}
