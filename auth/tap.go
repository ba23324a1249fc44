package auth

import (
	"crypto/subtle"
	"strings"

	"google.golang.org/grpc/metadata"

	"github.com/fanout/fanout/tenant"
)

// TapClass is what a server's tap (grpc.InTapHandle) can tell of a call
// from its method and headers alone, before its body is read: no database,
// no blocking.
type TapClass int

const (
	// TapUnverified is a call with a well-formed credential whose key is
	// not in the cache: only a lookup tells a real key from a made-up one.
	TapUnverified TapClass = iota
	// TapOpen is a call that needs no credential (health, reflection).
	TapOpen
	// TapNoCredential is a call that needs a credential and carries none,
	// or a malformed one: the interceptor refuses it whatever its body.
	TapNoCredential
	// TapVerified is a call whose key is cached, live, and whose secret
	// matches: the interceptor will authenticate it without the database.
	TapVerified
)

// Tap classifies a call of method with headers md for the tap, and for a
// TapVerified call names who it is (the principal the interceptor will
// find, but for its scopes). It takes the cache's lock for a map read and
// hashes the secret; it never queries the database. Its answer is advice
// for admission: the interceptor still authenticates every call.
func (a *Authenticator) Tap(method string, md metadata.MD) (TapClass, tenant.Principal) {
	_, open, err := methodScope(method)
	switch {
	case err != nil: // gRPC answers a method it does not serve; a known one is up to the interceptor
		return TapUnverified, tenant.Principal{}
	case open:
		return TapOpen, tenant.Principal{}
	}
	return a.TapCredential(md.Get("authorization"))
}

// TapCredential classifies a call that needs a credential by its
// authorization header values alone, as Tap does: TapNoCredential,
// TapUnverified or TapVerified (with who it is). The HTTP listener calls
// it before it reads a body.
func (a *Authenticator) TapCredential(vals []string) (TapClass, tenant.Principal) {
	if len(vals) != 1 {
		return TapNoCredential, tenant.Principal{}
	}
	token, ok := strings.CutPrefix(vals[0], "Bearer ")
	if !ok {
		return TapNoCredential, tenant.Principal{}
	}
	keyID, digest, err := ParseToken(strings.TrimSpace(token))
	if err != nil {
		return TapNoCredential, tenant.Principal{}
	}
	a.mu.Lock()
	c := a.cache[keyID]
	a.mu.Unlock()
	if c == nil || !c.rec.Live || subtle.ConstantTimeCompare(c.rec.SecretSHA256, digest) != 1 {
		return TapUnverified, tenant.Principal{}
	}
	return TapVerified, tenant.Principal{Tenant: c.rec.TenantID, KeyID: keyID}
}

// ErrNoCredential is the status the interceptor answers a call that needs
// a credential and carries none (TapNoCredential).
func ErrNoCredential() error { return errUnauthenticated("") }
