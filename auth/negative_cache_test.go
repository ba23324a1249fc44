package auth_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fanout/fanout/auth"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/tenant"
)

// TestUnknownKeysAreCachedAsUnknown: 3,000 calls with 30 unknown key ids
// (well-formed tokens of keys never stored) cost at most one lookup per id
// per auth.NegativeCacheTTL on the authenticator's pool, counted as the
// pool's connection acquisitions (each query takes one); and a key created
// after a miss on its id works within auth.NegativeCacheTTL.
func TestUnknownKeysAreCachedAsUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, err := store.Open(b.ctx, storetest.NodeURL(t, b.url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	a := auth.NewAuthenticator(store.NewKeys(pool, nil), auth.Config{}) // no watcher: nothing else queries
	const ids, calls = 30, 3000
	tokens := make([]string, ids)
	for i := range tokens {
		if _, tokens[i], _, err = auth.NewKey(); err != nil {
			t.Fatal(err)
		}
	}
	start, before := time.Now(), pool.Stat().AcquireCount()
	for i := range calls {
		if _, err := a.Authenticate(b.ctx, tokens[i%ids]); code(err) != codes.Unauthenticated {
			t.Fatalf("call %d with an unknown key: %v; want UNAUTHENTICATED", i, err)
		}
	}
	queries, elapsed := pool.Stat().AcquireCount()-before, time.Since(start)
	// Each id may be looked up once per TTL that the loop spans.
	bound := int64(ids) * (1 + int64(elapsed/auth.NegativeCacheTTL))
	t.Logf("%d calls with %d unknown ids: %d queries in %s (bound %d)", calls, ids, queries, elapsed, bound)
	if queries > bound {
		t.Errorf("%d calls with %d unknown ids cost %d queries in %s; want at most %d", calls, ids, queries, elapsed, bound)
	}

	// A key created after a miss on its id.
	id, token, digest, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(b.ctx, token); code(err) != codes.Unauthenticated {
		t.Fatalf("a key not yet created: %v; want UNAUTHENTICATED", err)
	}
	created := time.Now()
	if _, err := b.keys.CreateKey(b.ctx, tenant.CreateKeyParams{Actor: b.owner, KeyID: id, TenantID: "acme",
		Scopes: []string{"read"}, SecretSHA256: digest}); err != nil {
		t.Fatal(err)
	}
	// The margin above the TTL is for the lookup and scheduling.
	pollUntil(t, auth.NegativeCacheTTL+500*time.Millisecond, "a key created after a miss working", func() bool {
		_, err := a.Authenticate(b.ctx, token)
		return err == nil
	})
	t.Logf("a key created after a miss worked %s after its creation", time.Since(created))
}
