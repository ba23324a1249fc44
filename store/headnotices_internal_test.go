package store

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store/storetest"
)

// TestHeadNoticesFitByBytes: the heads of runs announced together are
// split into notifications by their bytes, not their count: 100 runs
// whose ids are 150 bytes long (80 of them would make 12 kB) are heard in
// notifications each within NOTIFY's 8,000 bytes. A run whose id is longer
// than notifyRunIDBytes is left to the poll, and costs the others nothing.
func TestHeadNoticesFitByBytes(t *testing.T) {
	t.Parallel()
	url := storetest.NodeURL(t, storetest.NewDB(t))
	pool, err := OpenPool(t.Context(), url, PoolConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	n := NewNotifier(url, NotifierConfig{Logger: slog.New(slog.DiscardHandler)})
	storetest.Background(t, n.Run)
	var mu sync.Mutex
	heard := map[string]bool{}
	longest := 0
	ready := make(chan struct{}, 4)
	defer n.Subscribe(RunEventsChannel, Handler{
		Connected: func() { ready <- struct{}{} },
		Notify: func(p string) {
			mu.Lock()
			defer mu.Unlock()
			longest = max(longest, len(p))
			for run := range strings.SplitSeq(p, ",") {
				id, _, _ := strings.Cut(run, " ")
				heard[id] = true
			}
		},
	})()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("the notifier did not listen within 10s")
	}
	rs := NewRuns(pool, RunsConfig{})
	defer rs.Close()
	var ids []string
	for i := range 101 {
		id := fmt.Sprintf("%03d-%s", i, strings.Repeat("r", 146))
		if i == 100 {
			id = "long-" + strings.Repeat("r", notifyRunIDBytes)
		}
		run := &fanoutv1.Run{RunId: id, TenantId: "ten", IdempotencyKey: fmt.Sprint("k", i),
			Spec: &fanoutv1.RunSpec{IdempotencyKey: fmt.Sprint("k", i), TenantId: "ten", Goal: "g"}}
		if _, _, err := rs.CreateRun(t.Context(), run, "n"); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	rs.notices.wait()
	mu.Lock()
	clear(heard)
	mu.Unlock()
	h := newHeadNotices(pool, slog.New(slog.DiscardHandler))
	h.announce(ids...)
	h.wait()
	for deadline := time.Now().Add(10 * time.Second); ; {
		mu.Lock()
		got, long := 0, longest
		for _, id := range ids[:100] {
			if heard[id] {
				got++
			}
		}
		unannounced := !heard[ids[100]]
		mu.Unlock()
		if got == 100 {
			if long >= 8000 {
				t.Errorf("a notification of %d bytes; NOTIFY takes under 8,000", long)
			}
			if !unannounced {
				t.Errorf("the run whose id is %d bytes was announced; want it left to the poll", len(ids[100]))
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 100 runs heard within 10s of their announce (longest notification %d bytes)", got, long)
		}
		time.Sleep(10 * time.Millisecond) // polling what was heard
	}
}
