package admin_test

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

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

// bundle is AdminService as node.OpenOrchestrator serves it: behind an
// Authenticator on the orchestrator's login, acting on AdminService's own
// login, with a client whose context carries a live admin key.
type bundle struct {
	ctx     context.Context // carries the admin key
	client  fanoutv1.AdminServiceClient
	owner   *store.Pool
	adminID string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	url := storetest.NewDB(t)
	open := func(u string) *store.Pool {
		p, err := store.Open(t.Context(), u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	owner, node, adminPool := open(url), open(storetest.NodeURL(t, url)), open(storetest.AdminURL(t, url))
	keys := store.NewKeys(owner, nil)
	who := storetest.Actor(t, owner)
	if _, err := keys.CreateTenant(t.Context(), who, "acme", tenant.Quotas{}); err != nil {
		t.Fatal(err)
	}
	id, token, digest, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keys.CreateKey(t.Context(), tenant.CreateKeyParams{Actor: who, KeyID: id, Scopes: []string{"admin"}, SecretSHA256: digest}); err != nil {
		t.Fatal(err)
	}
	a := auth.NewAuthenticator(store.NewKeys(node, nil), auth.Config{})
	srv := grpc.NewServer(a.ServerOptions()...)
	fanoutv1.RegisterAdminServiceServer(srv, admin.NewServer(store.NewKeys(adminPool, nil), store.NewLedger(adminPool), nil))
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
	return &bundle{ctx: metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+token),
		client: fanoutv1.NewAdminServiceClient(conn), owner: owner, adminID: id}
}

// actions returns the admin log's rows since action id after, as
// "actor action".
func (b *bundle) actions(t *testing.T, after int64) []string {
	t.Helper()
	rows, err := b.owner.Query(b.ctx, `SELECT actor || ' ' || action FROM admin_audit WHERE action_id > $1 ORDER BY action_id`, after)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func (b *bundle) lastAction(t *testing.T) int64 {
	t.Helper()
	var id int64
	if err := b.owner.QueryRow(b.ctx, `SELECT coalesce(max(action_id), 0) FROM admin_audit`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// fields returns the fields a status's BadRequest names.
func fields(err error) []string {
	var out []string
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				out = append(out, v.GetField())
			}
		}
	}
	return out
}

// TestCreateKeyRefusesExpiryBeforeNow (issue 40, item 7): CreateKey with
// an expire_time before now is INVALID_ARGUMENT naming expire_time,
// whatever the value — the zero instant 0001-01-01T00:00:00Z (which was
// taken as "never expires"), 2020-01-01, a time far in the past, a second
// ago — and writes nothing: no key, no admin log row. An expiry in an hour
// is taken, and ListKeys shows it.
func TestCreateKeyRefusesExpiryBeforeNow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	before := b.lastAction(t)
	for _, c := range []struct {
		name string
		at   *timestamppb.Timestamp
	}{
		{"the zero instant", timestamppb.New(time.Time{})},
		{"0001-01-01T00:00:00Z by its seconds", &timestamppb.Timestamp{Seconds: -62135596800}},
		{"2020-01-01", timestamppb.New(time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC))},
		{"year 1000", timestamppb.New(time.Date(1000, 6, 1, 0, 0, 0, 0, time.UTC))},
		{"a second ago", timestamppb.New(time.Now().Add(-time.Second))},
	} {
		_, err := b.client.CreateKey(b.ctx, &fanoutv1.CreateKeyRequest{TenantId: "acme", Name: c.name, Scopes: []string{"read"},
			ExpireTime: c.at})
		if status.Code(err) != codes.InvalidArgument || !slices.Equal(fields(err), []string{"expire_time"}) {
			t.Errorf("CreateKey expiring at %s (%s): %v, fields %v; want INVALID_ARGUMENT naming expire_time",
				c.name, c.at.AsTime().Format(time.RFC3339), err, fields(err))
		}
	}
	list, err := b.client.ListKeys(b.ctx, &fanoutv1.ListKeysRequest{TenantId: "acme"})
	if err != nil || len(list.GetKeys()) != 0 {
		t.Errorf("acme's keys after the refused creates: %v, %v; want none", list.GetKeys(), err)
	}
	if got := b.actions(t, before); len(got) != 0 {
		t.Errorf("admin log after the refused creates: %v; want nothing", got)
	}
	in := time.Now().Add(time.Hour).Truncate(time.Second)
	ck, err := b.client.CreateKey(b.ctx, &fanoutv1.CreateKeyRequest{TenantId: "acme", Scopes: []string{"read"}, ExpireTime: timestamppb.New(in)})
	if err != nil || !ck.GetKey().GetExpireTime().AsTime().Equal(in) {
		t.Fatalf("CreateKey expiring in an hour = %v, %v; want it, expiring at %s", ck, err, in)
	}
}

// TestAdminKeyActsAsItself (issue 40, item 6): through the real
// AdminService, an admin key's changes — a tenant, its quotas and budget,
// a key, a revocation — are taken, and the admin log names the key: the
// service hands the database the secret its caller presented, which the
// database checks before it names the key (a key id alone is refused:
// store's TestAdminLoginCannotActAsAKeyWithoutItsSecret).
func TestAdminKeyActsAsItself(t *testing.T) {
	t.Parallel()
	b := setup(t)
	before := b.lastAction(t)
	if _, err := b.client.CreateTenant(b.ctx, &fanoutv1.CreateTenantRequest{TenantId: "globex"}); err != nil {
		t.Fatalf("CreateTenant: %v", err)
	}
	if _, err := b.client.UpdateTenant(b.ctx, &fanoutv1.UpdateTenantRequest{TenantId: "globex",
		Quotas: &fanoutv1.TenantQuotas{}, Budget: &fanoutv1.TenantBudget{LimitTokens: 10_000, Period: fanoutv1.BudgetPeriod_BUDGET_PERIOD_DAY}}); err != nil {
		t.Fatalf("UpdateTenant: %v", err)
	}
	ck, err := b.client.CreateKey(b.ctx, &fanoutv1.CreateKeyRequest{TenantId: "globex", Scopes: []string{"read"}})
	if err != nil {
		t.Fatalf("CreateKey: %v", err)
	}
	if _, err := b.client.RevokeKey(b.ctx, &fanoutv1.RevokeKeyRequest{KeyId: ck.GetKey().GetKeyId()}); err != nil {
		t.Fatalf("RevokeKey: %v", err)
	}
	got := b.actions(t, before)
	want := []string{"tenant.create", "tenant.set_quotas", "tenant.set_budget", "key.create", "key.revoke"}
	for i := range want {
		want[i] = "key:" + b.adminID + " " + want[i]
	}
	if !slices.Equal(got, want) {
		t.Errorf("admin log = %v\nwant %v", got, want)
	}
	for _, a := range got {
		if strings.Contains(a, ck.GetToken()) {
			t.Errorf("admin log names a token: %q", a)
		}
	}
}
