package auth_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fanout/fanout/admin"
	"github.com/fanout/fanout/auth"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/tenant"
)

func TestMain(m *testing.M) {
	storetest.MigrateFunc = store.Migrate
	storetest.Main(m)
}

// fakeOrchestrator answers GetRun with the caller's principal and holds
// WatchRun open until its context ends.
type fakeOrchestrator struct {
	fanoutv1.UnimplementedOrchestratorServiceServer
}

func (fakeOrchestrator) GetRun(ctx context.Context, _ *fanoutv1.GetRunRequest) (*fanoutv1.GetRunResponse, error) {
	p, ok := tenant.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "no principal")
	}
	return &fanoutv1.GetRunResponse{Run: &fanoutv1.Run{RunId: p.Tenant + "/" + p.KeyID}}, nil
}

func (fakeOrchestrator) WatchRun(_ *fanoutv1.WatchRunRequest, s grpc.ServerStreamingServer[fanoutv1.WatchRunResponse]) error {
	if err := s.Send(&fanoutv1.WatchRunResponse{}); err != nil {
		return err
	}
	<-s.Context().Done()
	return s.Context().Err()
}

type bundle struct {
	ctx   context.Context
	url   string
	keys  *store.Keys
	owner string
	logs  *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx := t.Context()
	url := storetest.NewDB(t)
	pool, err := store.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := &bundle{ctx: ctx, url: url, keys: store.NewKeys(pool, nil), logs: &syncBuffer{}}
	var role string
	if err := pool.QueryRow(ctx, "SELECT current_user").Scan(&role); err != nil {
		t.Fatal(err)
	}
	b.owner = "role:" + role
	if _, err := b.keys.CreateTenant(ctx, b.owner, "acme", tenant.Quotas{}); err != nil {
		t.Fatal(err)
	}
	return b
}

// replica starts a grpc server with an Authenticator (as a node would, on
// the node role) and returns a client connection to it.
func (b *bundle) replica(t *testing.T, cfg auth.Config) (fanoutv1.OrchestratorServiceClient, *grpc.ClientConn) {
	t.Helper()
	pool, err := store.Open(b.ctx, storetest.NodeURL(t, b.url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cfg.Logger = slog.New(slog.NewJSONHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	n := store.NewNotifier(storetest.NodeURL(t, b.url), store.NotifierConfig{})
	storetest.Background(t, n.Run)
	a := auth.NewAuthenticator(store.NewKeys(pool, n), cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	srv := grpc.NewServer(a.ServerOptions()...)
	fanoutv1.RegisterOrchestratorServiceServer(srv, fakeOrchestrator{})
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		srv.Stop()
		<-served
		cancel()
		if err := <-done; err != nil {
			t.Errorf("authenticator Run: %v", err)
		}
	})
	return fanoutv1.NewOrchestratorServiceClient(conn), conn
}

// key creates a key and returns its id and token.
func (b *bundle) key(t *testing.T, tenantID string, scopes []string, rpm int32) (string, string) {
	t.Helper()
	id, token, digest, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.keys.CreateKey(b.ctx, tenant.CreateKeyParams{Actor: b.owner, KeyID: id, TenantID: tenantID, Scopes: scopes,
		SecretSHA256: digest, RequestsPerMinute: rpm}); err != nil {
		t.Fatal(err)
	}
	return id, token
}

func withToken(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

func code(err error) codes.Code { return status.Code(err) }

// TestKeyAuthenticate: a good key calls with its tenant and id in the
// principal; wrong secret, unknown id, malformed, none, expired and revoked
// are UNAUTHENTICATED; health needs no credential.
func TestKeyAuthenticate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client, conn := b.replica(t, auth.Config{})
	id, token := b.key(t, "acme", []string{"read"}, 0)
	res, err := client.GetRun(withToken(b.ctx, token), &fanoutv1.GetRunRequest{})
	if err != nil || res.GetRun().GetRunId() != "acme/"+id {
		t.Fatalf("GetRun with a good key = %v, %v; want principal acme/%s", res, err, id)
	}
	_, otherToken := b.key(t, "acme", []string{"read"}, 0)
	wrongSecret := token[:len("fanout_")+20] + otherToken[len("fanout_")+20:]
	unknownID := "fanout_fk_ffffffffffffffff_" + token[len("fanout_")+20:]
	expID, expToken := b.key(t, "acme", []string{"read"}, 0)
	revID, revToken := b.key(t, "acme", []string{"read"}, 0)
	if _, err := client.GetRun(withToken(b.ctx, revToken), &fanoutv1.GetRunRequest{}); err != nil { // cached now
		t.Fatal(err)
	}
	if _, err := b.keys.RevokeKey(b.ctx, b.owner, revID); err != nil {
		t.Fatal(err)
	}
	pool, _ := store.Open(b.ctx, b.url)
	defer pool.Close()
	if _, err := pool.Exec(b.ctx, "UPDATE api_key SET expires_at = now() - interval '1 second' WHERE key_id = $1", expID); err != nil {
		t.Fatal(err)
	}
	for name, ctx := range map[string]context.Context{
		"wrong secret": withToken(b.ctx, wrongSecret),
		"unknown id":   withToken(b.ctx, unknownID),
		"malformed":    withToken(b.ctx, "fanout_fk_123_abc"),
		"not bearer":   metadata.AppendToOutgoingContext(b.ctx, "authorization", "Basic "+token),
		"none":         b.ctx,
		"expired":      withToken(b.ctx, expToken),
	} {
		if _, err := client.GetRun(ctx, &fanoutv1.GetRunRequest{}); code(err) != codes.Unauthenticated {
			t.Errorf("%s: %v; want UNAUTHENTICATED", name, err)
		}
	}
	// The revoked key was cached: it stops once the watcher sees it.
	waitFor(t, 5*time.Second, "revoked key refused", func() bool {
		_, err := client.GetRun(withToken(b.ctx, revToken), &fanoutv1.GetRunRequest{})
		return code(err) == codes.Unauthenticated
	})
	if _, err := healthpb.NewHealthClient(conn).Check(b.ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health without a credential: %v", err)
	}
	// The authenticator alone.
	a := auth.NewAuthenticator(b.keys, auth.Config{})
	if _, err := a.Authenticate(b.ctx, expToken); code(err) != codes.Unauthenticated {
		t.Errorf("Authenticate(expired) = %v; want UNAUTHENTICATED", err)
	}
	if p, err := a.Authenticate(b.ctx, token); err != nil || p.Tenant != "acme" || p.KeyID != id || !p.Has(tenant.ScopeRead) || p.Has(tenant.ScopeRun) {
		t.Errorf("Authenticate = %+v, %v", p, err)
	}
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestEveryMethodHasAScope: every method of OrchestratorService has a
// scope (a method added without one fails here), an unknown method is
// refused, and a key without the scope is PERMISSION_DENIED naming it.
func TestEveryMethodHasAScope(t *testing.T) {
	t.Parallel()
	want := map[string]tenant.Scope{
		"StartRun": tenant.ScopeRun, "Run": tenant.ScopeRun, "GetRun": tenant.ScopeRead,
		"WatchRun": tenant.ScopeRead, "ListRuns": tenant.ScopeRead, "CancelRun": tenant.ScopeCancel,
		"ListApprovals": tenant.ScopeApprove, "ApproveToolCall": tenant.ScopeApprove, "DenyToolCall": tenant.ScopeApprove,
		"ListToolCalls": tenant.ScopeRead, "GetSpend": tenant.ScopeAudit,
		"ListRunTasks": tenant.ScopeRead, "ListRunFacts": tenant.ScopeRead,
		"ContinueRun": tenant.ScopeRun, "ForkRun": tenant.ScopeRun,
	}
	sd := fanoutv1.OrchestratorService_ServiceDesc
	var names []string
	for _, m := range sd.Methods {
		names = append(names, m.MethodName)
	}
	for _, s := range sd.Streams {
		names = append(names, s.StreamName)
	}
	for _, n := range names {
		s, open, err := auth.MethodScope("/" + sd.ServiceName + "/" + n)
		if err != nil || open || s != want[n] || s == "" {
			t.Errorf("%s: scope %q open %v err %v; want %q", n, s, open, err, want[n])
		}
	}
	if _, _, err := auth.MethodScope("/fanout.v1.OrchestratorService/DropAll"); code(err) != codes.PermissionDenied {
		t.Errorf("unknown method: %v; want PERMISSION_DENIED", err)
	}
	if _, _, err := auth.MethodScope("/fanout.v1.SubagentService/Execute"); code(err) != codes.PermissionDenied {
		t.Errorf("worker method on the caller edge: %v; want PERMISSION_DENIED", err)
	}
	b := setup(t)
	client, _ := b.replica(t, auth.Config{})
	_, token := b.key(t, "acme", []string{"run"}, 0)
	_, err := client.GetRun(withToken(b.ctx, token), &fanoutv1.GetRunRequest{})
	if code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), `"read"`) {
		t.Errorf("GetRun with a run-only key: %v; want PERMISSION_DENIED naming read", err)
	}
}

// TestKeyRevocationEndsStreams: a stream open on a key ends with
// UNAUTHENTICATED once the key is revoked, on both replicas, and also when
// the replicas only poll (no NOTIFY).
func TestKeyRevocationEndsStreams(t *testing.T) {
	t.Parallel()
	for _, notify := range []bool{true, false} {
		name := "notify"
		if !notify {
			name = "poll-only"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cfg := auth.Config{DisableNotify: !notify}
			c1, _ := b.replica(t, cfg)
			c2, _ := b.replica(t, cfg)
			id, token := b.key(t, "acme", []string{"read"}, 0)
			ended := make(chan error, 2)
			for _, c := range []fanoutv1.OrchestratorServiceClient{c1, c2} {
				s, err := c.WatchRun(withToken(b.ctx, token), &fanoutv1.WatchRunRequest{})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s.Recv(); err != nil { // the stream is open and authenticated
					t.Fatal(err)
				}
				go func() {
					_, err := s.Recv()
					ended <- err
				}()
			}
			if _, err := b.keys.RevokeKey(b.ctx, b.owner, id); err != nil {
				t.Fatal(err)
			}
			deadline := time.After(5 * time.Second)
			for range 2 {
				select {
				case err := <-ended:
					if code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), id+" was revoked") {
						t.Errorf("stream ended with %v; want UNAUTHENTICATED naming %s", err, id)
					}
				case <-deadline:
					t.Fatal("a stream on the revoked key still open after 5s")
				}
			}
		})
	}
}

// TestKeyRateLimit: a key of 2 requests per minute gets 2 calls, then
// RESOURCE_EXHAUSTED with a QuotaFailure naming the key and the limit.
func TestKeyRateLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client, _ := b.replica(t, auth.Config{})
	id, token := b.key(t, "acme", []string{"read"}, 2)
	for i := range 2 {
		if _, err := client.GetRun(withToken(b.ctx, token), &fanoutv1.GetRunRequest{}); err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
	}
	_, err := client.GetRun(withToken(b.ctx, token), &fanoutv1.GetRunRequest{})
	if code(err) != codes.ResourceExhausted {
		t.Fatalf("call 3: %v; want RESOURCE_EXHAUSTED", err)
	}
	var qf *errdetails.QuotaFailure
	for _, d := range status.Convert(err).Details() {
		if q, ok := d.(*errdetails.QuotaFailure); ok {
			qf = q
		}
	}
	if qf == nil || qf.GetViolations()[0].GetSubject() != "key:"+id || !strings.Contains(qf.GetViolations()[0].GetDescription(), "2 requests per minute") {
		t.Errorf("QuotaFailure = %v; want subject key:%s and the limit", qf, id)
	}
}

// TestKeyCanaryNeverLeaks: a canary token's secret appears in no log line
// and no error of any failure path.
func TestKeyCanaryNeverLeaks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client, _ := b.replica(t, auth.Config{})
	id, token := b.key(t, "acme", []string{"run"}, 1)
	secret := token[len("fanout_")+20:]
	var errs []error
	calls := []func() error{
		func() error { _, err := client.GetRun(withToken(b.ctx, token), &fanoutv1.GetRunRequest{}); return err },
		func() error {
			_, err := client.ListRuns(withToken(b.ctx, token), &fanoutv1.ListRunsRequest{})
			return err
		},
		func() error {
			_, err := client.GetRun(withToken(b.ctx, token+"x"), &fanoutv1.GetRunRequest{})
			return err
		},
		func() error {
			_, err := client.GetRun(withToken(b.ctx, "fanout_fk_ffffffffffffffff_"+secret), &fanoutv1.GetRunRequest{})
			return err
		},
	}
	for _, c := range calls {
		errs = append(errs, c())
	}
	if _, err := b.keys.RevokeKey(b.ctx, b.owner, id); err != nil {
		t.Fatal(err)
	}
	a := auth.NewAuthenticator(b.keys, auth.Config{})
	_, err := a.Authenticate(b.ctx, token)
	errs = append(errs, err)
	for i, err := range errs {
		if err == nil {
			t.Errorf("call %d succeeded; every call here should fail", i)
			continue
		}
		if strings.Contains(err.Error(), secret) || errors.Is(err, context.Canceled) {
			t.Errorf("call %d error holds the secret or was cancelled: %v", i, err)
		}
	}
	if strings.Contains(b.logs.String(), secret) {
		t.Errorf("the logs hold the secret")
	}
}

// TestNoneModeIsAnonymous: --auth none puts an anonymous principal in
// every call.
func TestNoneModeIsAnonymous(t *testing.T) {
	t.Parallel()
	srv := grpc.NewServer(auth.NoneServerOptions()...)
	fanoutv1.RegisterOrchestratorServiceServer(srv, fakeOrchestrator{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lis) }()
	defer func() { srv.Stop(); <-served }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	res, err := fanoutv1.NewOrchestratorServiceClient(conn).GetRun(t.Context(), &fanoutv1.GetRunRequest{})
	if err != nil || res.GetRun().GetRunId() != "/" {
		t.Errorf("GetRun under --auth none = %v, %v; want an anonymous principal", res, err)
	}
}

// TestAdminServer: an admin key creates a tenant and a key whose token
// works once returned; a tenant key is PERMISSION_DENIED on AdminService;
// every AdminService method needs the admin scope; the log names the key.
func TestAdminServer(t *testing.T) {
	t.Parallel()
	sd := fanoutv1.AdminService_ServiceDesc
	for _, m := range sd.Methods {
		if s, open, err := auth.MethodScope("/" + sd.ServiceName + "/" + m.MethodName); err != nil || open || s != tenant.ScopeAdmin {
			t.Errorf("%s: scope %q open %v err %v; want admin", m.MethodName, s, open, err)
		}
	}
	b := setup(t)
	pool, err := store.Open(b.ctx, storetest.NodeURL(t, b.url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	keys := store.NewKeys(pool, nil)
	a := auth.NewAuthenticator(keys, auth.Config{})
	srv := grpc.NewServer(a.ServerOptions()...)
	// AdminService logs in as the admin role, as with --admin-database-url.
	adminPool, err := store.Open(b.ctx, storetest.AdminURL(t, b.url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(adminPool.Close)
	fanoutv1.RegisterAdminServiceServer(srv, admin.NewServer(store.NewKeys(adminPool, nil), store.NewLedger(adminPool), nil))
	fanoutv1.RegisterOrchestratorServiceServer(srv, fakeOrchestrator{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-served })
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	admin := fanoutv1.NewAdminServiceClient(conn)
	adminID, adminToken := b.key(t, "", []string{"admin"}, 0)
	_, tenantToken := b.key(t, "acme", []string{"run", "read", "cancel", "audit"}, 0)
	ctx := withToken(b.ctx, adminToken)
	if _, err := admin.CreateTenant(withToken(b.ctx, tenantToken), &fanoutv1.CreateTenantRequest{TenantId: "globex"}); code(err) != codes.PermissionDenied {
		t.Errorf("CreateTenant with a tenant key: %v; want PERMISSION_DENIED", err)
	}
	if _, err := admin.CreateTenant(ctx, &fanoutv1.CreateTenantRequest{TenantId: "globex",
		Quotas: &fanoutv1.TenantQuotas{MaxTasksInFlight: ptr[int32](10_000)}}); code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), "max_tasks_in_flight") {
		t.Errorf("CreateTenant with a bad quota: %v; want INVALID_ARGUMENT naming max_tasks_in_flight", err)
	}
	if _, err := admin.CreateTenant(ctx, &fanoutv1.CreateTenantRequest{TenantId: "acme"}); code(err) != codes.AlreadyExists {
		t.Errorf("CreateTenant(acme) again: %v; want ALREADY_EXISTS", err)
	}
	if _, err := admin.CreateTenant(ctx, &fanoutv1.CreateTenantRequest{TenantId: "globex",
		Quotas: &fanoutv1.TenantQuotas{MaxRunTokens: ptr[int64](1000)}}); err != nil {
		t.Fatal(err)
	}
	got, err := admin.GetTenant(ctx, &fanoutv1.GetTenantRequest{TenantId: "globex"})
	if err != nil || got.GetTenant().GetQuotas().GetMaxRunTokens() != 1000 {
		t.Errorf("GetTenant = %v, %v", got, err)
	}
	ck, err := admin.CreateKey(ctx, &fanoutv1.CreateKeyRequest{TenantId: "globex", Name: "ci", Scopes: []string{"read"}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := fanoutv1.NewOrchestratorServiceClient(conn).GetRun(withToken(b.ctx, ck.GetToken()), &fanoutv1.GetRunRequest{})
	if err != nil || res.GetRun().GetRunId() != "globex/"+ck.GetKey().GetKeyId() {
		t.Errorf("the new key's call = %v, %v; want principal globex/%s", res, err, ck.GetKey().GetKeyId())
	}
	list, err := admin.ListKeys(ctx, &fanoutv1.ListKeysRequest{TenantId: "globex"})
	if err != nil || len(list.GetKeys()) != 1 || strings.Contains(list.String(), ck.GetToken()[len("fanout_")+20:]) {
		t.Errorf("ListKeys = %v, %v; want the one key without its secret", list, err)
	}
	rk, err := admin.RevokeKey(ctx, &fanoutv1.RevokeKeyRequest{KeyId: ck.GetKey().GetKeyId()})
	if err != nil || rk.GetKey().GetRevokedBy() != "key:"+adminID {
		t.Errorf("RevokeKey = %v, %v; want revoked by key:%s", rk, err, adminID)
	}
	var actors []string
	rows, err := adminPool.Query(b.ctx, "SELECT DISTINCT actor FROM admin_audit WHERE action IN ('tenant.create', 'key.revoke') AND tenant_id = 'globex'")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		actors = append(actors, s)
	}
	if len(actors) != 1 || actors[0] != "key:"+adminID {
		t.Errorf("admin log actors = %v; want key:%s", actors, adminID)
	}
}

func ptr[T any](v T) *T { return &v }
