package store_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// TestAppendsAnnounceTheirHeads: 200 runs, each appended to 5 times by
// concurrent callers (group commit), are heard on RunEventsChannel with
// their final heads; the notices are coalesced (fewer notifications than
// appends, several runs a payload) and every payload is within NOTIFY's
// 8,000 bytes.
func TestAppendsAnnounceTheirHeads(t *testing.T) {
	t.Parallel()
	const runs, appends = 200, 5
	b := setup(t)
	pool, err := store.OpenPool(b.ctx, storetest.NodeURL(t, b.url), store.PoolConfig{}) // as a node sends them
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rs := store.NewRuns(pool, store.RunsConfig{Coalesce: true})
	defer rs.Close()
	n := b.notifier(t, store.NotifierConfig{})
	var mu sync.Mutex
	heads := map[string]int64{}
	notifications, longest := 0, 0
	ready := make(chan struct{}, 4)
	defer n.Subscribe(store.RunEventsChannel, store.Handler{
		Connected: func() { ready <- struct{}{} },
		Notify: func(p string) {
			mu.Lock()
			defer mu.Unlock()
			notifications++
			longest = max(longest, len(p))
			for run := range strings.SplitSeq(p, ",") {
				var id string
				var head int64
				if _, err := fmt.Sscanf(run, "%s %d", &id, &head); err == nil {
					heads[id] = max(heads[id], head)
				}
			}
		},
	})()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("the notifier did not listen within 10s")
	}
	for i := range runs {
		id := fmt.Sprintf("run-%03d", i)
		if _, _, err := rs.CreateRun(b.ctx, draftRun(id, "ten", "k"+id), "n"); err != nil {
			t.Fatal(err)
		}
	}
	ev := &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskQueued{TaskQueued: &fanoutv1.TaskQueued{TaskId: "t"}}}
	var wg sync.WaitGroup
	for i := range runs {
		wg.Go(func() {
			for range appends {
				if _, err := rs.AppendEvent(b.ctx, fmt.Sprintf("run-%03d", i), ev); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	for {
		mu.Lock()
		heard := 0
		for _, h := range heads {
			if h == appends {
				heard++
			}
		}
		count, size := notifications, longest
		mu.Unlock()
		if heard == runs {
			t.Logf("%d appends heard in %d notifications, the longest %d bytes", runs*appends, count, size)
			if count >= runs*appends {
				t.Errorf("%d notifications for %d appends: not coalesced", count, runs*appends)
			}
			if size > 8000 {
				t.Errorf("a payload of %d bytes: over NOTIFY's 8,000", size)
			}
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d runs heard at their final head (%d)", heard, runs, appends)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
