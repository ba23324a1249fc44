// Package auth authenticates the callers of the orchestrator's API: API keys
// that fanout issues (a key id and a secret shown once, stored as SHA-256),
// each bound to one tenant and a set of scopes, or an admin key that
// manages tenants and keys. It works over tenant.KeyLookup (store.Keys
// implements it); its gRPC interceptors put the caller's tenant.Principal
// in the call's context, and the services take the tenant from it and from
// nowhere else. AdminService is its adapter over tenant.Directory.
package auth

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fanout/fanout/internal/poll"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/tenant"
)

// MaxPollInterval bounds Config.PollInterval. The promise is that a
// revoked or expired key stops within half a second on every replica, even
// with the NOTIFY missed: the poll's own query and the cancel it delivers
// take time after the tick (up to ~40 ms measured on a loaded machine), so
// the poll runs more often than that.
const MaxPollInterval = 400 * time.Millisecond

// The negative cache: a key id looked up and not found is refused without
// a query for NegativeCacheTTL, so a caller repeating unknown ids costs the
// database one lookup per id per TTL. It holds at most NegativeCacheSize
// ids (about 40 bytes each); a full cache drops its expired ids, then
// arbitrary ones. A key created after a miss on its id (ids are 64 random
// bits: only a caller who guessed it missed on it) works within the TTL.
const (
	NegativeCacheSize = 10_000
	NegativeCacheTTL  = 2 * time.Second
)

// The known ids: the ids of the live keys, read from the database when the
// watcher starts and every KnownIDsInterval after (at most KnownIDsSize of
// them, the newest first; about 40 bytes each). A key the tap cannot verify
// from the cache but whose id is known is looked up in a lane of its own
// (TapKnown), which a flood of made-up ids cannot fill: after a restart,
// every tenant's key is served during such a flood, and a key created
// during one within KnownIDsInterval.
const (
	KnownIDsSize     = 100_000
	KnownIDsInterval = 5 * time.Second
)

// Config tunes an Authenticator.
type Config struct {
	// PollInterval is how often the keys in the cache and those with open
	// streams are checked against the database's now(). Default and
	// maximum MaxPollInterval.
	PollInterval time.Duration
	// DisableNotify turns off the LISTEN on store.KeyRevokedChannel and
	// store.TenantQuotasChannel, leaving the poll alone (tests of the poll
	// path).
	DisableNotify bool
	// Logger receives the watcher's errors (never a credential). Default
	// slog.Default().
	Logger *slog.Logger
}

// errUnauthenticated is what every failed authentication says: one message
// for unknown id and wrong secret, so neither can be told from the other.
func errUnauthenticated(keyID string) error {
	if keyID == "" {
		return status.Error(codes.Unauthenticated, "missing or malformed credential: send authorization: Bearer fanout_fk_<id>_<secret>")
	}
	return status.Errorf(codes.Unauthenticated, "API key %s is not valid", keyID)
}

// cached is a key as last read, and whether it has died since.
type cached struct {
	rec tenant.KeyRecord
	// definedRPM is the rate its bucket was last defined at.
	definedRPM int32
}

// Authenticator checks the API keys of the calls and keeps a cache of the
// keys it looked up. A revoked or expired key stops working within
// PollInterval on every replica, and within a NOTIFY round trip normally:
// the watcher (Run) evicts it from the cache and ends every stream open on
// it with UNAUTHENTICATED. A changed request rate (the key's tenant's
// key_requests_per_minute) reaches the cached keys the same way: the NOTIFY
// of admin_set_quotas evicts the tenant's keys, and the poll carries the
// rate it reads.
//
// Expiry is in database time: LookupKey and the poll compare expires_at
// with the database's now(); between polls a cached key is not re-checked.
type Authenticator struct {
	keys tenant.KeyLookup
	cfg  Config

	mu      sync.Mutex
	cache   map[string]*cached
	unknown map[string]time.Time // the negative cache: id -> until when
	known   map[string]struct{}  // the known ids
	streams map[string]map[*streamEntry]struct{}
	// lookups are the lookups of key ids under way (lookupKey): the calls
	// of one id wait for one query.
	lookups map[string]*keyLookup

	// loop polls every PollInterval, and at once when a notification says
	// something changed (wake).
	loop *poll.Loop
}

type streamEntry struct{ cancel context.CancelCauseFunc }

// NewAuthenticator returns an authenticator over keys tuned by cfg. Run its
// watcher (Run) for as long as it serves.
func NewAuthenticator(keys tenant.KeyLookup, cfg Config) *Authenticator {
	if cfg.PollInterval <= 0 || cfg.PollInterval > MaxPollInterval {
		cfg.PollInterval = MaxPollInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Authenticator{keys: keys, cfg: cfg, cache: map[string]*cached{}, unknown: map[string]time.Time{},
		streams: map[string]map[*streamEntry]struct{}{}, lookups: map[string]*keyLookup{}, loop: poll.New()}
}

// RevokedError is the cause of a stream ended because its key died. It is
// UNAUTHENTICATED (GRPCStatus): a handler that returns its context's cause
// returns what the caller is answered, not an unexpected error.
type RevokedError struct{ KeyID string }

func (e *RevokedError) Error() string { return "API key " + e.KeyID + " was revoked or has expired" }

// GRPCStatus is the status of a call ended by e: UNAUTHENTICATED.
func (e *RevokedError) GRPCStatus() *status.Status {
	return status.New(codes.Unauthenticated, e.Error())
}

// Authenticate returns the principal of token, or UNAUTHENTICATED for a
// malformed token, an unknown key, a wrong secret, or a revoked or expired
// key. The error names the key id at most.
func (a *Authenticator) Authenticate(ctx context.Context, token string) (tenant.Principal, error) {
	p, _, err := a.authenticate(ctx, token)
	return p, err
}

func (a *Authenticator) authenticate(ctx context.Context, token string) (tenant.Principal, *cached, error) {
	keyID, digest, err := ParseToken(token)
	if err != nil {
		return tenant.Principal{}, nil, errUnauthenticated("")
	}
	a.mu.Lock()
	c := a.cache[keyID]
	until, unknown := a.unknown[keyID]
	a.mu.Unlock()
	if c == nil && unknown && time.Now().Before(until) {
		return tenant.Principal{}, nil, errUnauthenticated(keyID)
	}
	if c == nil {
		if c, err = a.lookupKey(ctx, keyID); err != nil {
			if errors.Is(err, tenant.ErrKeyNotFound) {
				return tenant.Principal{}, nil, errUnauthenticated(keyID)
			}
			a.cfg.Logger.ErrorContext(ctx, "look up API key", "key_id", keyID, "err", err)
			return tenant.Principal{}, nil, status.Error(codes.Unavailable, "cannot check the credential now; retry")
		}
	}
	if subtle.ConstantTimeCompare(c.rec.SecretSHA256, digest) != 1 {
		return tenant.Principal{}, nil, errUnauthenticated(keyID)
	}
	if !c.rec.Live {
		return tenant.Principal{}, nil, status.Errorf(codes.Unauthenticated, "API key %s was revoked or has expired", keyID)
	}
	return principal(keyID, c.rec), c, nil
}

// keyLookup is a lookup of a key id under way, which the calls of the
// same id wait for until done is closed.
type keyLookup struct {
	done chan struct{}
	c    *cached
	err  error
	// abandoned: the call that looked it up ended first, and err says so
	// rather than anything about the key.
	abandoned bool
}

// lookupKey looks key id up in the database, once for all the calls that
// ask for it at the same time: a client's burst of first calls with a key
// this process has not cached costs one query (and the node's admission
// lets such a burst share one share of the unauthenticated budget). The
// key found is cached if live, an id not found goes to the negative cache
// (tenant.ErrKeyNotFound), before the next call can miss both. A call
// waits for the lookup under way until its own ctx ends; if the call that
// looked it up ended before the answer, the next looks it up again.
func (a *Authenticator) lookupKey(ctx context.Context, id string) (*cached, error) {
	for {
		a.mu.Lock()
		l := a.lookups[id]
		lead := l == nil
		if lead {
			l = &keyLookup{done: make(chan struct{})}
			a.lookups[id] = l
		}
		a.mu.Unlock()
		if lead {
			a.lookUp(ctx, id, l)
			return l.c, l.err
		}
		select {
		case <-l.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if !l.abandoned {
			return l.c, l.err
		}
	}
}

// lookUp runs lookup l of key id, keeps what it found (the cache, the
// negative cache) and ends l, in the same critical section: a call that
// finds no lookup under way finds its result.
func (a *Authenticator) lookUp(ctx context.Context, id string, l *keyLookup) {
	rec, err := a.keys.LookupKey(ctx, id)
	if errors.Is(err, tenant.ErrKeyNotFound) {
		a.rememberUnknown(id)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case err != nil:
		l.err, l.abandoned = err, ctx.Err() != nil
	case !rec.Live:
		l.c = &cached{rec: rec}
	case a.cache[id] != nil:
		l.c = a.cache[id]
	default:
		l.c = &cached{rec: rec}
		a.cache[id] = l.c
	}
	delete(a.lookups, id)
	close(l.done)
}

// principal is who a call of key id, whose record is rec, acts as.
func principal(keyID string, rec tenant.KeyRecord) tenant.Principal {
	p := tenant.Principal{Tenant: rec.TenantID, KeyID: keyID}
	for _, s := range rec.Scopes {
		p.Scopes = append(p.Scopes, tenant.Scope(s))
	}
	return p
}

// rememberUnknown puts id in the negative cache for NegativeCacheTTL.
func (a *Authenticator) rememberUnknown(id string) {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.unknown) >= NegativeCacheSize {
		for k, until := range a.unknown {
			if !now.Before(until) {
				delete(a.unknown, k)
			}
		}
		for k := range a.unknown {
			if len(a.unknown) < NegativeCacheSize {
				break
			}
			delete(a.unknown, k)
		}
	}
	a.unknown[id] = now.Add(NegativeCacheTTL)
}

// Run watches for revoked and expired keys and changed rates until ctx
// ends: a poll of the cached keys and the keys with open streams every
// PollInterval, and at once when a notification on store.KeyRevokedChannel
// or store.TenantQuotasChannel arrives (LISTEN, reconnecting with
// backoff). A notification is a hint, never an order: any database login
// may NOTIFY, so what is done is what the poll reads from the tables (a
// forged one costs a poll, and however many arrive, one poll runs at a
// time). It returns nil once ctx ends.
func (a *Authenticator) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	if !a.cfg.DisableNotify {
		wg.Add(1)
		go func() { defer wg.Done(); a.listen(ctx) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); a.readKnown(ctx) }()
	a.loop.Run(ctx, a.cfg.PollInterval, a.poll)
	wg.Wait()
	return nil
}

// LoadKnownIDs reads the known ids now; the watcher (Run) reads them again
// every KnownIDsInterval.
func (a *Authenticator) LoadKnownIDs(ctx context.Context) error {
	ids, err := a.keys.LiveKeyIDs(ctx, KnownIDsSize)
	if err != nil {
		return err
	}
	known := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		known[id] = struct{}{}
	}
	a.mu.Lock()
	a.known = known
	a.mu.Unlock()
	return nil
}

// readKnown reads the known ids every KnownIDsInterval until ctx ends.
func (a *Authenticator) readKnown(ctx context.Context) {
	tick := time.NewTicker(KnownIDsInterval)
	defer tick.Stop()
	for {
		if err := a.LoadKnownIDs(ctx); err != nil && ctx.Err() == nil {
			a.cfg.Logger.WarnContext(ctx, "read the live key ids", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// listen wakes the poll on every key notification, and each time the
// process's notifier has (re)connected (what was sent meanwhile is gone),
// until ctx ends. Without a notifier the poll alone carries changes.
func (a *Authenticator) listen(ctx context.Context) {
	err := a.keys.ListenKeyEvents(ctx, a.wake,
		tenant.KeyEvents{Revoked: func(string) { a.wake() }, QuotasChanged: func(string) { a.wake() }})
	if err != nil && ctx.Err() == nil {
		a.cfg.Logger.WarnContext(ctx, "no key notifications; the poll alone carries revocations", "err", err,
			"poll_interval", a.cfg.PollInterval)
	}
}

func (a *Authenticator) poll(ctx context.Context) {
	a.mu.Lock()
	ids := make([]string, 0, len(a.cache)+len(a.streams))
	seen := map[string]bool{}
	for id := range a.cache {
		ids, seen[id] = append(ids, id), true
	}
	for id := range a.streams {
		if !seen[id] {
			ids = append(ids, id)
		}
	}
	a.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	states, err := a.keys.KeyStates(ctx, ids)
	if err != nil {
		if ctx.Err() == nil {
			a.cfg.Logger.WarnContext(ctx, "poll the state of cached API keys", "err", err)
		}
		return
	}
	for _, s := range states {
		if !s.Live {
			a.kill(s.ID)
			continue
		}
		a.setRate(s.ID, s.EffectiveRequestsPerMinute)
	}
}

// setRate carries a changed request rate to cached key id. The cached
// record is replaced, never changed: calls in flight read theirs unlocked.
func (a *Authenticator) setRate(id string, rpm int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c := a.cache[id]; c != nil && c.rec.EffectiveRequestsPerMinute != rpm {
		rec := c.rec
		rec.EffectiveRequestsPerMinute = rpm
		a.cache[id] = &cached{rec: rec}
	}
}

// wake makes Run poll now, or as soon as the poll under way ends.
func (a *Authenticator) wake() { a.loop.Wake() }

// kill evicts key id from the cache and ends its open streams.
func (a *Authenticator) kill(id string) {
	a.mu.Lock()
	delete(a.cache, id)
	streams := a.streams[id]
	delete(a.streams, id)
	a.mu.Unlock()
	for s := range streams {
		s.cancel(&RevokedError{KeyID: id})
	}
}

// bearer returns the token of the call's authorization metadata.
func bearer(ctx context.Context) (string, bool) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) != 1 {
		return "", false
	}
	token, ok := strings.CutPrefix(vals[0], "Bearer ")
	return strings.TrimSpace(token), ok && token != ""
}

// check authenticates the call of method and returns its principal and key.
func (a *Authenticator) check(ctx context.Context, method string) (context.Context, *cached, error) {
	scope, open, err := methodScope(method)
	if err != nil {
		return nil, nil, err
	}
	if open {
		return ctx, nil, nil
	}
	token, ok := bearer(ctx)
	if !ok {
		return nil, nil, errUnauthenticated("")
	}
	p, c, err := a.authenticate(ctx, token)
	if err != nil {
		return nil, nil, err
	}
	if !p.Has(scope) {
		return nil, nil, status.Errorf(codes.PermissionDenied, "API key %s lacks scope %q, which %s needs", p.KeyID, scope, method)
	}
	if err := a.takeRequest(ctx, c); err != nil {
		return nil, nil, err
	}
	return tenant.WithPresentedSecret(tenant.NewContext(ctx, p), secretOf(token)), c, nil
}

// takeRequest takes one request from the key's fleet-wide bucket
// ("key:<id>" in rate_bucket) when the key or its tenant sets a rate.
func (a *Authenticator) takeRequest(ctx context.Context, c *cached) error {
	rpm := c.rec.EffectiveRequestsPerMinute
	if rpm <= 0 {
		return nil
	}
	id := c.rec.ID
	a.mu.Lock()
	defined := c.definedRPM == rpm
	a.mu.Unlock()
	if !defined {
		if err := a.keys.DefineKeyRate(ctx, id, rpm); err != nil {
			a.cfg.Logger.ErrorContext(ctx, "define key rate", "key_id", id, "err", err)
			return status.Error(codes.Unavailable, "cannot check the request rate now; retry")
		}
		a.mu.Lock()
		c.definedRPM = rpm
		a.mu.Unlock()
	}
	wait, err := a.keys.TakeKeyRequest(ctx, id)
	if err != nil {
		a.cfg.Logger.ErrorContext(ctx, "take a key request", "key_id", id, "err", err)
		return status.Error(codes.Unavailable, "cannot check the request rate now; retry")
	}
	if wait == 0 {
		return nil
	}
	msg := fmt.Sprintf("API key %s is limited to %d requests per minute; retry in %s", id, rpm, wait.Round(time.Millisecond))
	st, derr := status.New(codes.ResourceExhausted, msg).WithDetails(
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
			Subject: "key:" + id, Description: fmt.Sprintf("at most %d requests per minute", rpm)}}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)})
	if derr != nil {
		return status.Error(codes.ResourceExhausted, msg)
	}
	return st.Err()
}

// openMethods need no credential: health checks and reflection.
var openPrefixes = []string{
	"/" + healthpb.Health_ServiceDesc.ServiceName + "/",
	"/grpc.reflection.v1.ServerReflection/",
	"/grpc.reflection.v1alpha.ServerReflection/",
}

// methodScopes is the scope each method of the API needs. A method missing
// here is refused (fail closed): TestEveryMethodHasAScope fails when a
// service grows one.
var methodScopes = map[string]tenant.Scope{
	fanoutv1.OrchestratorService_StartRun_FullMethodName:        tenant.ScopeRun,
	fanoutv1.OrchestratorService_Run_FullMethodName:             tenant.ScopeRun,
	fanoutv1.OrchestratorService_ContinueRun_FullMethodName:     tenant.ScopeRun,
	fanoutv1.OrchestratorService_ForkRun_FullMethodName:         tenant.ScopeRun,
	fanoutv1.OrchestratorService_GetRun_FullMethodName:          tenant.ScopeRead,
	fanoutv1.OrchestratorService_WatchRun_FullMethodName:        tenant.ScopeRead,
	fanoutv1.OrchestratorService_ListRuns_FullMethodName:        tenant.ScopeRead,
	fanoutv1.OrchestratorService_CancelRun_FullMethodName:       tenant.ScopeCancel,
	fanoutv1.OrchestratorService_ListApprovals_FullMethodName:   tenant.ScopeApprove,
	fanoutv1.OrchestratorService_ApproveToolCall_FullMethodName: tenant.ScopeApprove,
	fanoutv1.OrchestratorService_DenyToolCall_FullMethodName:    tenant.ScopeApprove,
	fanoutv1.OrchestratorService_ListToolCalls_FullMethodName:   tenant.ScopeRead,
	fanoutv1.OrchestratorService_ListRunTasks_FullMethodName:    tenant.ScopeRead,
	fanoutv1.OrchestratorService_ListRunFacts_FullMethodName:    tenant.ScopeRead,
	fanoutv1.OrchestratorService_GetSpend_FullMethodName:        tenant.ScopeAudit,
	fanoutv1.AdminService_CreateTenant_FullMethodName:           tenant.ScopeAdmin,
	fanoutv1.AdminService_UpdateTenant_FullMethodName:           tenant.ScopeAdmin,
	fanoutv1.AdminService_GetTenant_FullMethodName:              tenant.ScopeAdmin,
	fanoutv1.AdminService_CreateKey_FullMethodName:              tenant.ScopeAdmin,
	fanoutv1.AdminService_ListKeys_FullMethodName:               tenant.ScopeAdmin,
	fanoutv1.AdminService_RevokeKey_FullMethodName:              tenant.ScopeAdmin,
}

// MethodScope returns the scope a call of method (its full name,
// "/pkg.Service/Method") needs, open when it needs no credential, or
// PERMISSION_DENIED for a method the table does not know.
func MethodScope(method string) (scope tenant.Scope, open bool, err error) {
	return methodScope(method)
}

func methodScope(method string) (tenant.Scope, bool, error) {
	for _, p := range openPrefixes {
		if strings.HasPrefix(method, p) {
			return "", true, nil
		}
	}
	if s, ok := methodScopes[method]; ok {
		return s, false, nil
	}
	return "", false, status.Errorf(codes.PermissionDenied, "method %s is not open to API keys", method)
}

// UnaryInterceptor authenticates every unary call. It never logs the
// call's metadata.
func (a *Authenticator) UnaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, _, err := a.check(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// StreamInterceptor authenticates every streaming call and ends it with
// UNAUTHENTICATED when its key is revoked or expires while it is open.
func (a *Authenticator) StreamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, c, err := a.check(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	if c == nil { // an open method
		return handler(srv, ss)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	e := &streamEntry{cancel: cancel}
	id := c.rec.ID
	a.mu.Lock()
	if a.streams[id] == nil {
		a.streams[id] = map[*streamEntry]struct{}{}
	}
	a.streams[id][e] = struct{}{}
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.streams[id], e)
		if len(a.streams[id]) == 0 {
			delete(a.streams, id)
		}
		a.mu.Unlock()
	}()
	err = handler(srv, &contextStream{ServerStream: ss, ctx: ctx})
	var revoked *RevokedError
	if errors.As(context.Cause(ctx), &revoked) {
		return status.Errorf(codes.Unauthenticated, "API key %s was revoked", revoked.KeyID)
	}
	return err
}

// ServerOptions are the options that put the authenticator in front of
// every service of a grpc.Server.
func (a *Authenticator) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(a.UnaryInterceptor), grpc.ChainStreamInterceptor(a.StreamInterceptor)}
}

type contextStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *contextStream) Context() context.Context { return s.ctx }

// NoneServerOptions are the options of --auth none: every call carries an
// anonymous tenant.Principal (every scope, any tenant). For loopback and dev only.
func NoneServerOptions() []grpc.ServerOption {
	anon := tenant.Principal{Anonymous: true}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			return h(tenant.NewContext(ctx, anon), req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return h(srv, &contextStream{ServerStream: ss, ctx: tenant.NewContext(ss.Context(), anon)})
		}),
	}
}
