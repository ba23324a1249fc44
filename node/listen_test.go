package node_test

import (
	"testing"
	"time"

	"github.com/fanout/fanout/node"
	"github.com/fanout/fanout/store"
)

// TestOneListenConnectionPerProcess (issue 24): an orchestrator with API
// keys hears run ends (its watcher) and key events (its authenticator) on
// one LISTEN connection, not one each.
func TestOneListenConnectionPerProcess(t *testing.T) {
	t.Parallel()
	b, _ := openOrchestrator(t, node.BackendConfig{})
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := b.Pool().QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1`, store.ListenerApplicationName).Scan(&n); err != nil {
			t.Fatal(err)
		}
		var listening int
		if err := b.Pool().QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query ILIKE 'LISTEN%'`).Scan(&listening); err != nil {
			t.Fatal(err)
		}
		if n == 1 && listening == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections named %s and %d whose last statement was a LISTEN; want 1 and 1", n, store.ListenerApplicationName, listening)
		}
		time.Sleep(20 * time.Millisecond) // polling pg_stat_activity
	}
}
