package auth_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanout/fanout/auth"
	"github.com/fanout/fanout/tenant"
)

// gatedLookup is a KeyLookup whose lookups are counted and wait for open
// to close (or a minute), so that a test can have many calls miss the
// cache at once.
type gatedLookup struct {
	tenant.KeyLookup
	lookups atomic.Int64
	open    chan struct{}
}

func (g *gatedLookup) LookupKey(ctx context.Context, id string) (tenant.KeyRecord, error) {
	g.lookups.Add(1)
	select {
	case <-g.open:
	case <-time.After(time.Minute):
	case <-ctx.Done():
		return tenant.KeyRecord{}, ctx.Err()
	}
	return g.KeyLookup.LookupKey(ctx, id)
}

// TestABurstOfOneKeyCostsOneLookup (issue 44): 100 calls at once with a key
// the authenticator has not cached (a client's first calls) each looked the
// key up; now they wait for one lookup and are all authenticated. The
// lookup is held until every call has started, so that each of them misses
// the cache; and a call whose own context ends first is answered at once
// while the others still wait.
func TestABurstOfOneKeyCostsOneLookup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, token := b.key(t, "acme", []string{"read"}, 0)
	g := &gatedLookup{KeyLookup: b.keys, open: make(chan struct{})}
	a := auth.NewAuthenticator(g, auth.Config{})

	const calls = 100
	errs := make([]error, calls)
	var started, wg sync.WaitGroup
	started.Add(calls)
	for i := range errs {
		wg.Go(func() {
			started.Done()
			_, errs[i] = a.Authenticate(b.ctx, token)
		})
	}
	started.Wait()
	pollUntil(t, 10*time.Second, "the first lookup", func() bool { return g.lookups.Load() > 0 })
	gone, cancel := context.WithCancel(b.ctx)
	cancel()
	if _, err := a.Authenticate(gone, token); err == nil {
		t.Error("a call whose context had ended was authenticated while the lookup was held")
	}
	close(g.open)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d of the burst: %v", i, err)
		}
	}
	if n := g.lookups.Load(); n != 1 {
		t.Errorf("%d calls at once with one key not cached looked it up %d times; want once", calls, n)
	}
}
