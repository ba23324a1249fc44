package auth

import (
	"crypto/subtle"
	"strings"
	"time"

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
	// TapKnown is a call whose key is not in the cache but whose id is a
	// live key's (the known ids): it is looked up in a lane of its own.
	TapKnown
	// TapKnownBad is a call whose key this process knows to be bad without
	// the database: an id in the negative cache, or a cached key whose
	// secret does not match or that died. It is refused before its body
	// (ErrKnownBad), as the interceptor would refuse it after.
	TapKnownBad
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
// TapKnownBad, TapKnown, TapUnverified or TapVerified (with who it is, scopes
// included). The HTTP listener calls it before it reads a body.
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
	until, unknown := a.unknown[keyID]
	_, known := a.known[keyID]
	a.mu.Unlock()
	switch {
	case c == nil && unknown && time.Now().Before(until):
		return TapKnownBad, tenant.Principal{KeyID: keyID}
	case c == nil && known:
		return TapKnown, tenant.Principal{}
	case c == nil:
		return TapUnverified, tenant.Principal{}
	case !c.rec.Live || subtle.ConstantTimeCompare(c.rec.SecretSHA256, digest) != 1:
		return TapKnownBad, tenant.Principal{KeyID: keyID}
	}
	return TapVerified, principal(keyID, c.rec)
}

// Credential is who an authorization header's values (as TapCredential
// reads them) say a call is, as one string: its key id and the SHA-256 of
// its secret, the same for every call presenting the same key and secret
// and different for any other; "" for none or a malformed one. The node's
// admission lets the calls of one credential waiting for its key's lookup
// share that lookup.
func Credential(vals []string) string {
	if len(vals) != 1 {
		return ""
	}
	token, ok := strings.CutPrefix(vals[0], "Bearer ")
	if !ok {
		return ""
	}
	keyID, digest, err := ParseToken(strings.TrimSpace(token))
	if err != nil {
		return ""
	}
	return keyID + ":" + string(digest)
}

// ErrKnownBad is the status the interceptor answers a call of key id
// (TapKnownBad's principal's KeyID): the same as for any failed
// authentication, so that an unknown id and a wrong secret cannot be told
// apart.
func ErrKnownBad(keyID string) error { return errUnauthenticated(keyID) }

// ScopeOf is the scope a call of method needs, "" for a method open to
// every caller or one the table does not know (the interceptor refuses
// it): what the taps check before a body is read.
func ScopeOf(method string) tenant.Scope {
	s, _, err := methodScope(method)
	if err != nil {
		return ""
	}
	return s
}

// ErrNoCredential is the status the interceptor answers a call that needs
// a credential and carries none (TapNoCredential).
func ErrNoCredential() error { return errUnauthenticated("") }
