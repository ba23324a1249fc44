package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/fanout/fanout/auth"
	"github.com/fanout/fanout/tenant"
)

// DefaultUnauthenticatedBytes is the budget of the calls an orchestrator
// with API keys reads before it has authenticated them, when BackendConfig
// sets none: 64 MiB, seven calls at the default receive limit of 8 MiB.
const DefaultUnauthenticatedBytes = 64 << 20

// DefaultUnauthenticatedReadTimeout is how long a call admitted before
// authentication may take to be authenticated, when BackendConfig sets
// none: 8 MiB (the default receive limit) sent at under 1 MB/s still makes
// it, a caller trickling its request holds a share no longer.
const DefaultUnauthenticatedReadTimeout = 10 * time.Second

// unauthenticatedCalls caps the calls admitted unauthenticated whatever the
// byte budget allows (a small receive limit would admit thousands).
const unauthenticatedCalls = 64

// preauth is a non-blocking budget for the calls a server reads before it
// knows who sent them. gRPC reads and decodes a unary request whole before
// any interceptor runs, so an unauthenticated caller could make the server
// hold its receive limit per call; the tap (grpc.InTapHandle) admits such a
// call against this budget before the body is read, and the call gives it
// back once authenticated (releaseAdmission) or when it ends. The tap
// cannot see the body's size: each call is charged the receive limit. A
// call not authenticated within wait is ended (its request is not read
// further) and gives its share back.
type preauth struct {
	max  int64 // calls: min(byte budget / receive limit, unauthenticatedCalls)
	sem  *semaphore.Weighted
	wait time.Duration
	// what names the budget in a refusal.
	what string

	// burstSize is how many calls presenting one credential one share
	// admits (tryJoin): a call waiting for its key's lookup, its body not
	// read, holds its HTTP/2 stream and at most callerWindow of its body,
	// so a share of the receive limit covers receive limit / callerWindow
	// of them (128 with the defaults).
	burstSize int
	mu        sync.Mutex
	bursts    map[string]*burst // by credential (auth.Credential)
}

// burst is the calls presenting one credential that share one share of a
// preauth budget while its key is looked up (the first call looks it up,
// the others wait for its answer, auth.Authenticator's lookupKey): the
// share is given back when the last of them is authenticated or ends, and
// each is ended at the deadline of the first if not authenticated by then.
type burst struct {
	calls    int // admitted, not yet authenticated or ended
	deadline time.Time
}

// waitingCallBytes is what a call waiting in a burst may hold before its
// body is read: its stream's window and its headers (a burst's calls share
// one share of the receive limit, so a share admits receive limit /
// waitingCallBytes of them, 64 at the defaults).
const waitingCallBytes = callerWindow + maxHTTPHeaderBytes

func newPreauth(budgetBytes int64, recvLimit int, wait time.Duration, what string) *preauth {
	n := max(1, min(budgetBytes/int64(max(recvLimit, 1)), unauthenticatedCalls))
	return &preauth{max: n, sem: semaphore.NewWeighted(n), wait: wait, what: what,
		burstSize: max(1, recvLimit/waitingCallBytes), bursts: map[string]*burst{}}
}

// tryJoin admits a call presenting credential cred: into the burst of cred
// under way if it has room, else into a new one that takes a share of the
// budget (as does one whose burst is full or past its deadline); it
// reports false when none is left. It never waits. deadline is when the
// call is ended unless authenticated: its burst's.
func (p *preauth) tryJoin(cred string) (release func(), deadline time.Time, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.bursts[cred]
	if b == nil || b.calls >= p.burstSize || !time.Now().Before(b.deadline) {
		if !p.sem.TryAcquire(1) {
			return nil, time.Time{}, false
		}
		b = &burst{deadline: time.Now().Add(p.wait)}
		p.bursts[cred] = b
	}
	b.calls++
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if b.calls--; b.calls > 0 {
				return
			}
			if p.bursts[cred] == b {
				delete(p.bursts, cred)
			}
			p.sem.Release(1)
		})
	}, b.deadline, true
}

// tryAcquire takes one call's share of the budget, or reports false when
// the budget is spent. It never waits.
func (p *preauth) tryAcquire() (release func(), ok bool) {
	if !p.sem.TryAcquire(1) {
		return nil, false
	}
	var once sync.Once
	return func() { once.Do(func() { p.sem.Release(1) }) }, true
}

// acquire takes one call's share, waiting in turn until one is free, wait
// passes or ctx ends: the HTTP listener's lookups, which have a goroutine
// of their own, wait rather than fail.
func (p *preauth) acquire(ctx context.Context, wait time.Duration) (release func(), err error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := p.sem.Acquire(wctx, 1); err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, p.refusal()
	}
	var once sync.Once
	return func() { once.Do(func() { p.sem.Release(1) }) }, nil
}

type admissionKey struct{}

// admission holds what the tap took for a call until it is given back.
type admission struct {
	release func() // the share of a preauth budget; nil if none
	// tenantRelease is the tenant's slot the tap took for a verified key:
	// the call holds it to its end (tenantLimit.afterAuth takes none).
	tenantRelease func()
	// who is the verified key's principal (verified), scopes included.
	who      tenant.Principal
	verified bool
	// httpCharged: the HTTP listener charged the request's bytes already
	// (its body and every copy of it), so the gRPC gate takes none.
	httpCharged bool
	// end ends the call (its stream's context), with a cause.
	end context.CancelCauseFunc
}

// scopeDenied is PERMISSION_DENIED when who lacks the scope method needs,
// as the interceptor words it; nil otherwise (and for a method the table
// does not know: the interceptor refuses it).
func scopeDenied(method string, who tenant.Principal) error {
	if scope := auth.ScopeOf(method); scope != "" && !who.Has(scope) {
		return status.Errorf(codes.PermissionDenied, "API key %s lacks scope %q, which %s needs", who.KeyID, scope, method)
	}
	return nil
}

// releaseAdmission gives back what the tap took of a preauth budget for
// the call of ctx, if anything: the call is authenticated (or needs no
// credential). It returns the release of the tenant slot the tap took for
// it, or nil.
func releaseAdmission(ctx context.Context) (tenantRelease func()) {
	a, ok := ctx.Value(admissionKey{}).(*admission)
	if !ok {
		return nil
	}
	if a.release != nil {
		a.release()
	}
	return a.tenantRelease
}

// callerTap is the tap of the caller-facing server with API keys: a call
// that carries no credential is refused UNAUTHENTICATED before its body is
// read; one whose key is cached and verified takes a slot of its tenant's
// quota now, before its body is read, so that a tenant never has more than
// its quota of requests being read; any other (an unverified key, an open
// method) takes a share of the unverified or open budget, given back after
// authentication or when the call ends, and is ended if it is not
// authenticated within the budget's wait. The calls of one credential
// whose key is to be looked up share a share (preauth.tryJoin): a client's
// burst of first calls with a new key costs one. A call is refused
// RESOURCE_EXHAUSTED when none is left. It runs on the connection's reader:
// it never blocks and never queries the database.
func callerTap(keys *auth.Authenticator, adm callerAdmission) tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		class, who := keys.Tap(info.FullMethodName, info.Header)
		return adm.admit(ctx, info.FullMethodName, class, who, credential(class, info.Header.Get("authorization")))
	}
}

// admit admits a call of method that auth classed class (who, for a
// verified key) before its body is read, as callerTap says, and returns the
// context it runs in: a key this process knows to be bad is refused
// UNAUTHENTICATED, and a verified key that lacks the method's scope
// PERMISSION_DENIED, before the body. A call whose key is to be looked up
// presents credential cred (credential; "" for the others): it joins the
// burst of its credential (preauth.tryJoin). It never blocks and never
// queries the database.
func (adm callerAdmission) admit(ctx context.Context, method string, class auth.TapClass, who tenant.Principal, cred string) (context.Context, error) {
	var p *preauth
	switch class {
	case auth.TapVerified:
		if err := scopeDenied(method, who); err != nil {
			return nil, err
		}
		release, err := adm.tenants.tryAcquire(subject(who, true))
		if err != nil {
			return nil, err
		}
		context.AfterFunc(ctx, release) // the stream's context ends with the call
		ctx, end := context.WithCancelCause(ctx)
		return context.WithValue(ctx, admissionKey{}, &admission{tenantRelease: release, who: who, verified: true, end: end}), nil
	case auth.TapNoCredential:
		return nil, auth.ErrNoCredential()
	case auth.TapKnownBad:
		return nil, auth.ErrKnownBad(who.KeyID)
	case auth.TapOpen:
		p = adm.open
	case auth.TapKnown:
		p = adm.known
	default:
		p = adm.unverified
	}
	if cred != "" {
		release, deadline, ok := p.tryJoin(cred)
		if !ok {
			return nil, p.refusal()
		}
		return adm.admitted(ctx, release, time.Until(deadline))
	}
	release, ok := p.tryAcquire()
	if !ok {
		return nil, p.refusal()
	}
	return adm.admitted(ctx, release, p.wait)
}

// credential is the credential (auth.Credential) of a call of class whose
// authorization header has vals, when its key is to be looked up: its
// calls share one lookup. "" for any other class.
func credential(class auth.TapClass, vals []string) string {
	if class != auth.TapUnverified && class != auth.TapKnown {
		return ""
	}
	return auth.Credential(vals)
}

// lookup admits a call of class (TapKnown or TapUnverified) presenting
// credential cred for the lookup of its key: into the burst of cred under
// way, or a new one, if its lane has a share left; else waiting for a share
// of its own up to the budget's wait.
func (adm callerAdmission) lookup(ctx context.Context, class auth.TapClass, cred string) (context.Context, error) {
	p := adm.unverified
	if class == auth.TapKnown {
		p = adm.known
	}
	if release, deadline, ok := p.tryJoin(cred); ok {
		return adm.admitted(ctx, release, time.Until(deadline))
	}
	release, err := p.acquire(ctx, p.wait)
	if err != nil {
		return nil, err
	}
	return adm.admitted(ctx, release, p.wait)
}

// admitted is ctx of a call holding release of a preauth budget: given
// back when the call is authenticated or ends, and the call ended if it is
// not authenticated within wait.
func (adm callerAdmission) admitted(ctx context.Context, release func(), wait time.Duration) (context.Context, error) {
	ctx, end := context.WithCancelCause(ctx)
	late := time.AfterFunc(wait, func() { end(errLate) })
	done := func() { late.Stop(); release() }
	context.AfterFunc(ctx, done) // the stream's context ends with the call: nothing outlives it
	return context.WithValue(ctx, admissionKey{}, &admission{release: done, end: end}), nil
}

// errSlowRequest is the cause of the end of a call whose request was not
// read within the request read timeout once it had its charge.
var errSlowRequest = errors.New("its request was not sent within --request-read-timeout")

// readWithin reads a request with read, ending the call of ctx (whose tap
// gave it an end) if it is not read within d: a call holding its charge of
// the request-bytes budget sends its request in time or gives the charge
// back.
func readWithin(ctx context.Context, d time.Duration, read func() error) error {
	a, _ := ctx.Value(admissionKey{}).(*admission)
	if a == nil || a.end == nil || d <= 0 {
		return read()
	}
	slow := time.AfterFunc(d, func() { a.end(errSlowRequest) })
	defer slow.Stop()
	return read()
}

// errLate is the cause of the end of a call not authenticated within its
// budget's wait. (gRPC answers the caller CANCELLED: it reports a stream
// context's end without its cause.)
var errLate = errors.New("not authenticated within --unauthenticated-read-timeout: its request was not sent in time")

func (p *preauth) refusal() error {
	msg := fmt.Sprintf("this process reads at most %d %s calls at once before authenticating them (--unauthenticated-bytes); retry later", p.max, p.what)
	st, err := status.New(codes.ResourceExhausted, msg).WithDetails(&errdetails.QuotaFailure{
		Violations: []*errdetails.QuotaFailure_Violation{{Subject: "unauthenticated",
			Description: fmt.Sprintf("at most %d %s calls read before authentication", p.max, p.what)}}})
	if err != nil {
		return status.Error(codes.ResourceExhausted, msg)
	}
	return st.Err()
}

// tenantLimit caps the calls in flight per tenant, after authentication:
// one tenant's flood takes its quota, never the whole process's
// --max-streams, so other tenants' calls are still served.
type tenantLimit struct {
	max int64
	mu  sync.Mutex
	n   map[string]int64
}

func newTenantLimit(n int) *tenantLimit { return &tenantLimit{max: int64(n), n: map[string]int64{}} }

// tenantQuota is the quota of each tenant for a process serving maxStreams
// calls when set is 0: a quarter of it (at least one).
func tenantQuota(maxStreams, set int) int {
	if set > 0 {
		return set
	}
	return max(1, maxStreams/4)
}

// subject is whose quota a call of p counts against: its tenant, an admin
// key's own; "" for callers no quota applies to (anonymous, open methods).
func subject(p tenant.Principal, ok bool) string {
	switch {
	case !ok || p.Anonymous:
		return ""
	case p.Tenant != "":
		return "tenant:" + p.Tenant
	case p.KeyID != "":
		return "key:" + p.KeyID
	}
	return ""
}

// acquire takes a slot of the call's subject; release gives it back.
func (l *tenantLimit) acquire(ctx context.Context) (release func(), err error) {
	return l.tryAcquire(subject(tenant.FromContext(ctx)))
}

// tryAcquire takes a slot of subject who ("" takes none); release gives it
// back, once. It never waits.
func (l *tenantLimit) tryAcquire(who string) (release func(), err error) {
	if who == "" {
		return func() {}, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n[who] >= l.max {
		msg := fmt.Sprintf("%s holds at most %d concurrent calls on this process (--tenant-max-streams); retry later", who, l.max)
		st, derr := status.New(codes.ResourceExhausted, msg).WithDetails(&errdetails.QuotaFailure{
			Violations: []*errdetails.QuotaFailure_Violation{{Subject: who,
				Description: fmt.Sprintf("at most %d concurrent calls per tenant per process", l.max)}}})
		if derr != nil {
			return nil, status.Error(codes.ResourceExhausted, msg)
		}
		return nil, st.Err()
	}
	l.n[who]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.n[who]--; l.n[who] == 0 {
				delete(l.n, who)
			}
		})
	}, nil
}

// admitted gives back what the tap took of a preauth budget for the
// authenticated call of ctx and returns the release of its tenant's slot:
// the one the tap took, or one taken now.
func (l *tenantLimit) admitted(ctx context.Context) (release func(), err error) {
	if held := releaseAdmission(ctx); held != nil {
		return held, nil
	}
	return l.acquire(ctx)
}

// afterAuth are the interceptors that run once the authenticator's have:
// they give back the tap's admission and hold the call to its tenant's
// quota.
func (l *tenantLimit) afterAuth() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			release, err := l.admitted(ctx)
			if err != nil {
				return nil, err
			}
			defer release()
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			release, err := l.admitted(ss.Context())
			if err != nil {
				return err
			}
			defer release()
			return h(srv, ss)
		}),
	}
}
