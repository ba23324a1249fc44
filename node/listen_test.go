package node_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanout/fanout/node"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// TestOneListenConnectionPerProcess (issue 24): an orchestrator with API
// keys hears run ends (its watcher), key events (its authenticator) and
// the heads of runs whose events were written (its WatchRun followers) on
// one LISTEN connection, not one each.
func TestOneListenConnectionPerProcess(t *testing.T) {
	t.Parallel()
	b, _ := openOrchestrator(t, node.BackendConfig{})
	checkListening(t, b, store.ListenStatement)
}

// TestWorkerDoesNotListenOnRunEvents: a process that serves only a worker
// LISTENs on every channel but the run events': nothing in it reads them,
// and a session listening on a channel holds PostgreSQL's notification
// queue until it reads that channel's notifications, so one stopped worker
// would let the queue fill and every NOTIFY fail, fleet-wide.
func TestWorkerDoesNotListenOnRunEvents(t *testing.T) {
	t.Parallel()
	_, workerTrust, _, err := node.DevTrust(peerDir)
	if err != nil {
		t.Fatal(err)
	}
	m := node.NewMain(node.Config{
		Backend: node.BackendConfig{DatabaseURL: storetest.NewDB(t), Logger: quiet},
		Workers: []node.WorkerConfig{{Trust: workerTrust}},
	})
	if err := m.Open(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = m.Close(ctx)
	})
	if strings.Contains(store.WorkerListenStatement, store.RunEventsChannel) {
		t.Fatalf("a worker's LISTEN statement %q names %s", store.WorkerListenStatement, store.RunEventsChannel)
	}
	checkListening(t, m.Backend(), store.WorkerListenStatement)
}

// checkListening waits until b's database has one connection named
// store.ListenerApplicationName, the only one whose last statement was a
// LISTEN, and that statement is want.
func checkListening(t *testing.T, b *node.Backend, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var listens []string
		if err := b.Pool().QueryRow(t.Context(), `SELECT coalesce(array_agg(query), '{}') FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1`, store.ListenerApplicationName).Scan(&listens); err != nil {
			t.Fatal(err)
		}
		var listening int
		if err := b.Pool().QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query ILIKE 'LISTEN%'`).Scan(&listening); err != nil {
			t.Fatal(err)
		}
		if len(listens) == 1 && listening == 1 && listens[0] == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("connections named %s last ran %q, and %d connections' last statement was a LISTEN; want one, %q, and 1",
				store.ListenerApplicationName, listens, listening, want)
		}
		time.Sleep(20 * time.Millisecond) // polling pg_stat_activity
	}
}

// TestWorkerOnAnOrchestratorsLoginIsWarned (issue 23, from its second
// review): an orchestrator's login is not asked for the attempts' secrets,
// so a worker that logs in as one is not held to its dispatches; it says
// so when it starts, and a worker on a login only in fanout_worker does not.
func TestWorkerOnAnOrchestratorsLoginIsWarned(t *testing.T) {
	t.Parallel()
	url := storetest.NewDB(t)
	_, workerTrust, _, err := node.DevTrust(peerDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		login string
		warn  bool
	}{{storetest.NodeURL(t, url), true}, {storetest.WorkerURL(t, url), false}} {
		var logs bytes.Buffer
		var mu sync.Mutex
		b, err := node.OpenBackend(t.Context(), node.BackendConfig{DatabaseURL: tc.login,
			Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))})
		if err != nil {
			t.Fatal(err)
		}
		w, err := node.OpenWorker(t.Context(), b, node.WorkerConfig{Trust: workerTrust})
		if err != nil {
			b.Close()
			t.Fatal(err)
		}
		_ = w.Close(t.Context())
		b.Close()
		mu.Lock()
		warned := strings.Contains(logs.String(), "member of fanout_app")
		mu.Unlock()
		if warned != tc.warn {
			t.Errorf("worker on %s: warned %v; want %v (logs: %s)", map[bool]string{true: "an orchestrator's login", false: "a worker's login"}[tc.warn], warned, tc.warn, logs.String())
		}
	}
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
