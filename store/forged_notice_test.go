package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// TestForgedRunNoticeStopsNothing (issue 23, from its review): any
// database login may NOTIFY, a worker's or a tenant's auditor's too, and a
// notice "cancelled <run>" stopped every call of that run on every node.
// Now a notice is a hint: the watcher reads the run's account and delivers
// what it says. A worker's login notifies that open run "victim" was
// cancelled; then run "barrier" is really cancelled (its notice comes after
// the forged one on the same channel), and once barrier's subscriber has
// heard it, victim's must not have heard anything.
func TestForgedRunNoticeStopsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.openRun(t, "victim", 1000, 1, 1000)
	b.openRun(t, "barrier", 1000, 1, 1000)
	w := budget.NewWatcher(store.NewWatchSource(b.pool, b.notifier(t, store.NotifierConfig{})), budget.WatcherConfig{PollInterval: time.Hour})
	ctx, cancel := context.WithCancel(b.ctx)
	var wg sync.WaitGroup
	wg.Go(func() { w.Run(ctx) }) //nolint:errcheck // returns when the test ends it
	defer func() { cancel(); wg.Wait() }()
	victim, barrier := w.Subscribe("victim"), w.Subscribe("barrier")
	defer victim.Close()
	defer barrier.Close()
	awaitListener(t, b)

	conn, err := pgx.Connect(b.ctx, storetest.WorkerURL(t, b.url))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(b.ctx) //nolint:errcheck // test connection
	if _, err := conn.Exec(b.ctx, `SELECT pg_notify('fanout_run_state', 'cancelled victim')`); err != nil {
		t.Fatalf("a worker's login notifies: %v", err)
	}
	if _, err := b.ledger.CancelRun(b.ctx, "barrier", "user asked"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-barrier.Done():
		if sig := barrier.Signal(); sig.State != budget.StateCancelled || sig.Cause != "user asked" {
			t.Errorf("the cancelled run's signal: %+v; want cancelled, \"user asked\"", sig)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the real cancel's notice never arrived")
	}
	select {
	case <-victim.Done():
		t.Errorf("a forged notice stopped open run victim: %+v", victim.Signal())
	default:
	}
}
