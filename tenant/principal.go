package tenant

import (
	"context"
	"slices"
)

// Scope is what a key may do.
type Scope string

// The scopes. A tenant key holds any of run, read, cancel, audit and
// approve; an admin key holds admin only.
const (
	ScopeRun    Scope = "run"    // StartRun, Run
	ScopeRead   Scope = "read"   // GetRun, WatchRun, ListRuns, ListRunTasks, ListRunFacts, ListToolCalls
	ScopeCancel Scope = "cancel" // CancelRun
	ScopeAudit  Scope = "audit"  // GetSpend: the tenant's spend in money
	// ScopeApprove: ListApprovals, ApproveToolCall, DenyToolCall.
	ScopeApprove Scope = "approve"
	ScopeAdmin   Scope = "admin" // manage tenants and keys (global)
)

// TenantScopes are the scopes a tenant key may hold.
var TenantScopes = []Scope{ScopeRun, ScopeRead, ScopeCancel, ScopeAudit, ScopeApprove}

// Principal is who is calling.
type Principal struct {
	// Tenant is the tenant every call of this principal is scoped to; ""
	// for an admin key and for an anonymous caller (--auth none).
	Tenant string
	// KeyID names the key (never its secret); "" when anonymous.
	KeyID string
	// Scopes are what the key may do.
	Scopes []Scope
	// Role is a database role acting directly, not through the API: the
	// owner running `fanout tenant` or `fanout key` with --database-url.
	// It manages tenants and keys; the admin log names it "role:NAME".
	Role string
	// Anonymous is a caller of a node run with --auth none: it may name
	// any tenant (the request's tenant_id or the fanout-tenant-id header;
	// "default" when it names none) and holds every scope.
	Anonymous bool
}

// Admin reports whether the principal manages tenants and keys.
func (p Principal) Admin() bool {
	return p.Anonymous || p.Role != "" || slices.Contains(p.Scopes, ScopeAdmin)
}

// Has reports whether the principal holds scope s.
func (p Principal) Has(s Scope) bool { return p.Anonymous || slices.Contains(p.Scopes, s) }

// Actor is how the admin log names the principal: "key:ID", "role:NAME",
// or "anonymous" for --auth none.
func (p Principal) Actor() string {
	if p.Role != "" {
		return "role:" + p.Role
	}
	if p.KeyID == "" {
		return "anonymous"
	}
	return "key:" + p.KeyID
}

type principalKey struct{}

// NewContext returns ctx carrying p.
func NewContext(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal of the call, if the interceptors set one.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

type secretKey struct{}

// presented holds a presented secret in a context, behind a pointer:
// printed (a context's String, a %v or %#v of it in a log or a panic), it
// shows nothing of it.
type presented struct{ secret string }

func (*presented) String() string   { return "[secret]" }
func (*presented) GoString() string { return "[secret]" }

// WithPresentedSecret returns ctx carrying the secret part of the API key
// the caller presented, which the authenticator verified: what a process
// hands the database as proof of the key's use (docs/auditing.md "Who
// acted"). Never log it or put it in an error.
func WithPresentedSecret(ctx context.Context, secret string) context.Context {
	return context.WithValue(ctx, secretKey{}, &presented{secret})
}

// PresentedSecret returns the secret WithPresentedSecret put in ctx; ok is
// false for a call made without a key.
func PresentedSecret(ctx context.Context) (secret string, ok bool) {
	p, ok := ctx.Value(secretKey{}).(*presented)
	if !ok {
		return "", false
	}
	return p.secret, p.secret != ""
}
