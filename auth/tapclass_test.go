package auth_test

import (
	"testing"

	"github.com/fanout/fanout/auth"
)

// TestTapClassifiesBeforeTheBody (issue 40, item 3): what the taps can tell
// of a key before its body, without the database. A key found unknown is
// TapKnownBad from the negative cache (the review's flood reused made-up
// ids, and the pre-body check ignored the cache, so each took a slot of the
// unverified budget); a cached key with a wrong secret is TapKnownBad; a
// live key's id not in the cache is TapKnown once the known ids are read
// (its own lookup lane), an id that is no live key's TapUnverified; a
// cached key with its secret TapVerified, with its scopes.
func TestTapClassifiesBeforeTheBody(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, token := b.key(t, "acme", []string{"read"}, 0)
	_, other := b.key(t, "acme", []string{"read"}, 0)
	_, made, _, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	a := auth.NewAuthenticator(b.keys, auth.Config{})
	bearer := func(tok string) []string { return []string{"Bearer " + tok} }
	if c, _ := a.TapCredential(bearer(token)); c != auth.TapUnverified {
		t.Errorf("a live key before the known ids are read: %v; want TapUnverified", c)
	}
	if err := a.LoadKnownIDs(b.ctx); err != nil {
		t.Fatal(err)
	}
	if c, _ := a.TapCredential(bearer(token)); c != auth.TapKnown {
		t.Errorf("a live key not cached, its id known: %v; want TapKnown", c)
	}
	if c, _ := a.TapCredential(bearer(made)); c != auth.TapUnverified {
		t.Errorf("a made-up key, never looked up: %v; want TapUnverified", c)
	}
	if _, err := a.Authenticate(b.ctx, made); code(err) == 0 {
		t.Fatal("a made-up key authenticated")
	}
	if c, p := a.TapCredential(bearer(made)); c != auth.TapKnownBad || p.KeyID == "" {
		t.Errorf("a made-up key once looked up: %v %+v; want TapKnownBad naming its id (the negative cache)", c, p)
	}
	if _, err := a.Authenticate(b.ctx, token); err != nil {
		t.Fatal(err)
	}
	if c, p := a.TapCredential(bearer(token)); c != auth.TapVerified || p.Tenant != "acme" || len(p.Scopes) != 1 {
		t.Errorf("a cached key with its secret: %v %+v; want TapVerified as acme with its scope", c, p)
	}
	wrong := token[:len("fanout_")+20] + other[len("fanout_")+20:]
	if c, _ := a.TapCredential(bearer(wrong)); c != auth.TapKnownBad {
		t.Errorf("a cached key with a wrong secret: %v; want TapKnownBad", c)
	}
}
