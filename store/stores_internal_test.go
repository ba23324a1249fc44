package store

import (
	"testing"

	"github.com/fanout/fanout/store/storetest"
)

// TestEachStoreIsOnItsPool: OpenStores builds every store on the pool of
// whoever waits for it (docs/operations.md "Tuning"): what a paid call
// waits on on the ledger pool, what an API caller waits on on the API
// pool, so that callers who hold every API connection never delay a
// reservation, a tool write or a slot.
func TestEachStoreIsOnItsPool(t *testing.T) {
	t.Parallel()
	s, err := OpenStores(t.Context(), StoresConfig{DatabaseURL: storetest.NodeURL(t, storetest.NewDB(t)),
		LedgerPool: 2, APIPool: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if s.LedgerPool() == s.APIPool() || s.LedgerPool().Config().MaxConns != 2 || s.APIPool().Config().MaxConns != 3 {
		t.Fatalf("pools: ledger %d connections, API %d; want two pools of 2 and 3",
			s.LedgerPool().Config().MaxConns, s.APIPool().Config().MaxConns)
	}
	ledger, api := s.LedgerPool(), s.APIPool()
	for _, c := range []struct {
		store string
		got   *Pool
		want  *Pool
	}{
		{"Ledger", s.Ledger.pool, ledger},
		{"Writes", s.Writes.pool, ledger},
		{"Semaphore", s.Semaphore.pool, ledger},
		{"RateLimiter", s.RateLimiter.pool, ledger},
		{"Watch", s.Watch.pool, ledger},
		{"Runs", s.Runs.pool, api},
		{"Approvals", s.Approvals.pool, api},
		{"Spending", s.Spending.pool, api},
		{"Keys", s.Keys.pool, api},
		{"Keys' key-rate buckets", s.Keys.rate.pool, api},
	} {
		if c.got != c.want {
			name := map[*Pool]string{ledger: "ledger", api: "API"}
			t.Errorf("%s is on the %s pool; want the %s pool", c.store, name[c.got], name[c.want])
		}
	}
	if s.Watch.notifier != s.Notifier || s.Keys.notifier != s.Notifier {
		t.Error("the watcher's source and the keys must hear the process's one Notifier")
	}
}
