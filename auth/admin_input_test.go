package auth_test

import (
	"context"
	"math"
	"net"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fanout/fanout/admin"
	"github.com/fanout/fanout/auth"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// adminService serves AdminService (behind an Authenticator, on the node
// role, as node.OpenOrchestrator serves it) and returns a client, a context
// carrying an admin key, and the node role's pool.
func (b *bundle) adminService(t *testing.T) (fanoutv1.AdminServiceClient, context.Context, *store.Pool) {
	t.Helper()
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
	_, token := b.key(t, "", []string{"admin"}, 0)
	return fanoutv1.NewAdminServiceClient(conn), withToken(b.ctx, token), pool
}

// fieldViolations returns the fields a status's BadRequest names.
func fieldViolations(err error) []string {
	var fields []string
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
	}
	return fields
}

// TestAdminBadInputIsInvalidArgument: input PostgreSQL cannot hold (a NUL
// in a tenant id or a key name, an expiry past PostgreSQL's timestamptz
// range, a budget of 2^63-1) is INVALID_ARGUMENT with a BadRequest naming
// the field, through the real AdminService, as admin.proto promises; never
// INTERNAL. Each case is also refused before anything is written.
func TestAdminBadInputIsInvalidArgument(t *testing.T) {
	t.Parallel()
	b := setup(t)
	admin, ctx, _ := b.adminService(t)
	for _, tc := range []struct {
		name  string
		call  func() error
		field string
	}{
		{"NUL in CreateTenant tenant_id", func() error {
			_, err := admin.CreateTenant(ctx, &fanoutv1.CreateTenantRequest{TenantId: "glo\x00bex"})
			return err
		}, "tenant_id"},
		{"NUL in UpdateTenant tenant_id", func() error {
			_, err := admin.UpdateTenant(ctx, &fanoutv1.UpdateTenantRequest{TenantId: "ac\x00me",
				Quotas: &fanoutv1.TenantQuotas{}})
			return err
		}, "tenant_id"},
		{"NUL in GetTenant tenant_id", func() error {
			_, err := admin.GetTenant(ctx, &fanoutv1.GetTenantRequest{TenantId: "ac\x00me"})
			return err
		}, "tenant_id"},
		{"NUL in CreateKey name", func() error {
			_, err := admin.CreateKey(ctx, &fanoutv1.CreateKeyRequest{TenantId: "acme", Name: "ci\x00", Scopes: []string{"read"}})
			return err
		}, "name"},
		{"NUL in CreateKey tenant_id", func() error {
			_, err := admin.CreateKey(ctx, &fanoutv1.CreateKeyRequest{TenantId: "ac\x00me", Scopes: []string{"read"}})
			return err
		}, "tenant_id"},
		{"NUL in CreateKey scope", func() error {
			_, err := admin.CreateKey(ctx, &fanoutv1.CreateKeyRequest{TenantId: "acme", Scopes: []string{"re\x00ad"}})
			return err
		}, "scopes"},
		{"expiry past PostgreSQL's range", func() error {
			// Year 300000: PostgreSQL's timestamptz ends in 294276.
			_, err := admin.CreateKey(ctx, &fanoutv1.CreateKeyRequest{TenantId: "acme", Scopes: []string{"read"},
				ExpireTime: &timestamppb.Timestamp{Seconds: 9_404_000_000_000}})
			return err
		}, "expire_time"},
		{"expiry past protobuf's range", func() error {
			_, err := admin.CreateKey(ctx, &fanoutv1.CreateKeyRequest{TenantId: "acme", Scopes: []string{"read"},
				ExpireTime: &timestamppb.Timestamp{Seconds: math.MaxInt64}})
			return err
		}, "expire_time"},
		{"budget of 2^63-1", func() error {
			_, err := admin.UpdateTenant(ctx, &fanoutv1.UpdateTenantRequest{TenantId: "acme",
				Budget: &fanoutv1.TenantBudget{LimitTokens: math.MaxInt64, Period: fanoutv1.BudgetPeriod_BUDGET_PERIOD_DAY}})
			return err
		}, "budget.limit_tokens"},
		{"NUL in ListKeys tenant_id", func() error {
			_, err := admin.ListKeys(ctx, &fanoutv1.ListKeysRequest{TenantId: "ac\x00me"})
			return err
		}, "tenant_id"},
		{"NUL in RevokeKey key_id", func() error {
			_, err := admin.RevokeKey(ctx, &fanoutv1.RevokeKeyRequest{KeyId: "fk_\x00"})
			return err
		}, "key_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if code(err) != codes.InvalidArgument {
				t.Fatalf("%v; want INVALID_ARGUMENT naming %s", err, tc.field)
			}
			if f := fieldViolations(err); len(f) != 1 || f[0] != tc.field || !strings.Contains(status.Convert(err).Message(), tc.field) {
				t.Errorf("%v with field violations %q; want exactly one, naming %s, and the message naming it", err, f, tc.field)
			}
		})
	}
	var n int
	if err := b.pool(t).QueryRow(b.ctx, `SELECT (SELECT count(*) FROM tenant WHERE tenant_id <> 'acme')
		+ (SELECT count(*) FROM api_key WHERE tenant_id IS NOT NULL) + (SELECT count(*) FROM account)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d tenants, tenant keys or accounts written by refused calls; want none", n)
	}
}

// pool is an owner pool on the bundle's database.
func (b *bundle) pool(t *testing.T) *store.Pool {
	t.Helper()
	p, err := store.Open(b.ctx, b.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestUpdateTenantIsAtomic: UpdateTenant with a valid budget and an invalid
// quota is INVALID_ARGUMENT and changes nothing: the tenant's budget (none,
// or the one it had), its quotas and the admin log are as before.
func TestUpdateTenantIsAtomic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	admin, ctx, _ := b.adminService(t)
	owner := b.pool(t)
	if _, err := admin.CreateTenant(ctx, &fanoutv1.CreateTenantRequest{TenantId: "globex",
		Quotas: &fanoutv1.TenantQuotas{MaxRunTokens: ptr[int64](1000), KeyRequestsPerMinute: ptr[int32](60)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.UpdateTenant(ctx, &fanoutv1.UpdateTenantRequest{TenantId: "globex",
		Budget: &fanoutv1.TenantBudget{LimitTokens: 500, Period: fanoutv1.BudgetPeriod_BUDGET_PERIOD_DAY}}); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"acme", "globex"} { // no budget; a budget of 500/day
		t.Run(tenant, func(t *testing.T) {
			before := snapshotTenant(t, b, owner, admin, ctx, tenant)
			_, err := admin.UpdateTenant(ctx, &fanoutv1.UpdateTenantRequest{TenantId: tenant,
				Budget: &fanoutv1.TenantBudget{LimitTokens: 100_000, Period: fanoutv1.BudgetPeriod_BUDGET_PERIOD_MONTH},
				Quotas: &fanoutv1.TenantQuotas{MaxTasksInFlight: ptr[int32](10_000)}})
			if code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "max_tasks_in_flight") {
				t.Fatalf("UpdateTenant with a valid budget and max_tasks_in_flight 10000: %v; want INVALID_ARGUMENT naming max_tasks_in_flight", err)
			}
			if after := snapshotTenant(t, b, owner, admin, ctx, tenant); after != before {
				t.Errorf("a refused UpdateTenant changed the tenant:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

// snapshotTenant is what a refused UpdateTenant must leave as it was: the
// tenant as GetTenant shows it, its account, and its admin log.
func snapshotTenant(t *testing.T, b *bundle, owner *store.Pool, admin fanoutv1.AdminServiceClient, ctx context.Context, tenant string) string {
	t.Helper()
	got, err := admin.GetTenant(ctx, &fanoutv1.GetTenantRequest{TenantId: tenant})
	if err != nil {
		t.Fatal(err)
	}
	var db string
	if err := owner.QueryRow(b.ctx, `SELECT concat_ws(' | ',
		(SELECT string_agg(a::text, ',') FROM account a WHERE a.tenant_id = $1),
		(SELECT count(*)::text FROM admin_audit WHERE tenant_id = $1),
		(SELECT string_agg(action, ',' ORDER BY action) FROM admin_audit WHERE tenant_id = $1))`, tenant).Scan(&db); err != nil {
		t.Fatal(err)
	}
	return got.GetTenant().GetQuotas().String() + " | " + got.GetTenant().GetBudget().String() + " | " + db
}
