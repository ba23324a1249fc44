package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminsvc "github.com/fanout/fanout/admin"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/tenant"
)

const tenantUsage = `
Manage tenants: their quotas and token budget. With an admin key
(FANOUT_API_KEY) over the API, or directly as the schema's owner
(--database-url; the admin log names the role).

Usage:
  fanout tenant create TENANT [quota flags]
  fanout tenant set-budget TENANT --limit TOKENS --period day|month|none
  fanout tenant set-quotas TENANT [quota flags]
  fanout tenant show TENANT

Quota flags (0: no cap): --max-run-tokens, --max-concurrent-runs,
--max-tasks-in-flight, --key-requests-per-minute; and --headroom, the share
of a provider's rate limit the tenant's runs plan to use (0: the server's
default, 0.7).

Example:
  FANOUT_API_KEY=fanout_fk_... fanout tenant create acme --max-concurrent-runs 20
  fanout tenant set-budget acme --limit 5000000 --period day --database-url "$OWNER_URL"
`

const keyUsage = `
Manage API keys. The token is printed once, at create: it is not stored
(only its SHA-256 is) and cannot be shown again. With an admin key
(FANOUT_API_KEY) over the API, or directly as the schema's owner
(--database-url): the way to make the first admin key.

Usage:
  fanout key create --tenant TENANT [--scopes run,read,cancel] [--name N] [--expires 720h] [--requests-per-minute N]
  fanout key create --admin [--name N] --database-url OWNER_URL
  fanout key list [--tenant TENANT]
  fanout key revoke KEY_ID

Example:
  fanout key create --admin --name bootstrap --database-url "$OWNER_URL"
  FANOUT_API_KEY=fanout_fk_... fanout key create --tenant acme --name checkout-service
`

// adminFlags are a tenant or key command's: the API (clientFlags, with an
// admin key) or the owner's database URL.
type adminFlags struct {
	clientFlags
	databaseURL string
}

func (a *adminFlags) register(f *flags) {
	a.clientFlags.register(f)
	f.secretVar(&a.databaseURL, "database-url", "act directly as this PostgreSQL role (the schema's owner) instead of calling --addr with an admin key")
}

// connect returns the AdminService: over gRPC, or in process on the
// owner's database (the principal is the database role).
func (a *adminFlags) connect(ctx context.Context) (context.Context, fanoutv1.AdminServiceClient, func(), error) {
	if a.databaseURL == "" {
		opts, err := a.callOptions()
		if err != nil {
			return nil, nil, nil, err
		}
		conn, err := grpc.NewClient(a.addr, opts...)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--addr %q: %w", a.addr, err)
		}
		return ctx, fanoutv1.NewAdminServiceClient(conn), func() { _ = conn.Close() }, nil
	}
	st, err := store.OpenAdmin(ctx, a.databaseURL)
	if err != nil {
		return nil, nil, nil, err
	}
	var role string
	if err := st.Pool().QueryRow(ctx, "SELECT current_user").Scan(&role); err != nil {
		st.Close()
		return nil, nil, nil, err
	}
	srv := adminsvc.NewServer(st.Keys, st.Ledger, newLogger(io.Discard, "error"))
	return tenant.NewContext(ctx, tenant.Principal{Role: role}), localAdmin{srv}, st.Close, nil
}

// localAdmin calls an AdminServer in process.
type localAdmin struct{ s *adminsvc.Server }

func (l localAdmin) CreateTenant(ctx context.Context, r *fanoutv1.CreateTenantRequest, _ ...grpc.CallOption) (*fanoutv1.CreateTenantResponse, error) {
	return l.s.CreateTenant(ctx, r)
}

func (l localAdmin) UpdateTenant(ctx context.Context, r *fanoutv1.UpdateTenantRequest, _ ...grpc.CallOption) (*fanoutv1.UpdateTenantResponse, error) {
	return l.s.UpdateTenant(ctx, r)
}

func (l localAdmin) GetTenant(ctx context.Context, r *fanoutv1.GetTenantRequest, _ ...grpc.CallOption) (*fanoutv1.GetTenantResponse, error) {
	return l.s.GetTenant(ctx, r)
}

func (l localAdmin) CreateKey(ctx context.Context, r *fanoutv1.CreateKeyRequest, _ ...grpc.CallOption) (*fanoutv1.CreateKeyResponse, error) {
	return l.s.CreateKey(ctx, r)
}

func (l localAdmin) ListKeys(ctx context.Context, r *fanoutv1.ListKeysRequest, _ ...grpc.CallOption) (*fanoutv1.ListKeysResponse, error) {
	return l.s.ListKeys(ctx, r)
}

func (l localAdmin) RevokeKey(ctx context.Context, r *fanoutv1.RevokeKeyRequest, _ ...grpc.CallOption) (*fanoutv1.RevokeKeyResponse, error) {
	return l.s.RevokeKey(ctx, r)
}

// quotaFlags are the tenant quotas a command sets; 0 is no cap.
type quotaFlags struct {
	runTokens           int64
	runs, tasks, keyRPM int
	headroom            float64
}

func (q *quotaFlags) register(f *flags) {
	f.Int64Var(&q.runTokens, "max-run-tokens", 0, "the largest budget one run may ask for (0: no cap but the server's)")
	f.IntVar(&q.runs, "max-concurrent-runs", 0, "runs RUNNING at once (0: no cap)")
	f.IntVar(&q.tasks, "max-tasks-in-flight", 0, "tasks dispatched at once across the fleet (0: no cap)")
	f.IntVar(&q.keyRPM, "key-requests-per-minute", 0, "the request rate of each key that sets none (0: no cap)")
	f.Float64Var(&q.headroom, "headroom", 0, "the share (0 < h <= 1) of a provider's rate limit its runs plan to use when their concurrency is sized from it (0: the server's default, 0.7)")
}

func (q *quotaFlags) proto() *fanoutv1.TenantQuotas {
	out := &fanoutv1.TenantQuotas{}
	if q.runTokens > 0 {
		out.MaxRunTokens = &q.runTokens
	}
	if q.headroom != 0 {
		out.Headroom = &q.headroom
	}
	for _, v := range []struct {
		n   int
		dst **int32
	}{{q.runs, &out.MaxConcurrentRuns}, {q.tasks, &out.MaxTasksInFlight}, {q.keyRPM, &out.KeyRequestsPerMinute}} {
		if v.n > 0 {
			n := int32(v.n)
			*v.dst = &n
		}
	}
	return out
}

// leadingArg moves a positional argument that comes before the flags
// (`tenant show acme --json`) after them, where the flag package finds it.
func leadingArg(args []string) []string {
	if len(args) > 1 && !strings.HasPrefix(args[0], "-") {
		return append(args[1:len(args):len(args)], args[0])
	}
	return args
}

// oneArg takes the single positional argument a subcommand needs.
func oneArg(f *flags, what string) (string, error) {
	if f.NArg() != 1 {
		return "", fmt.Errorf("want one %s, got %d arguments", what, f.NArg())
	}
	return f.Arg(0), nil
}

func cmdTenant(ctx context.Context, env *Env, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprint(env.Stderr, strings.TrimLeft(tenantUsage, "\n"))
		return errUsage
	}
	verb := args[0]
	f := newFlags("tenant "+verb, tenantUsage, env.Stderr)
	var af adminFlags
	af.register(f)
	var q quotaFlags
	var limit int64
	var period string
	switch verb {
	case "create", "set-quotas":
		q.register(f)
	case "set-budget":
		f.Int64Var(&limit, "limit", 0, "tokens per period (required)")
		f.StringVar(&period, "period", "none", "day (from midnight UTC), month (from the 1st) or none (the limit in all)")
	case "show":
	default:
		return fmt.Errorf("unknown subcommand %q: want create, set-budget, set-quotas or show", verb)
	}
	if err := parseFlags(f, leadingArg(args[1:]), env); err != nil {
		return err
	}
	tenant, err := oneArg(f, "TENANT")
	if err != nil {
		return err
	}
	ctx, admin, done, err := af.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	var t *fanoutv1.Tenant
	switch verb {
	case "create":
		var resp *fanoutv1.CreateTenantResponse
		resp, err = admin.CreateTenant(ctx, &fanoutv1.CreateTenantRequest{TenantId: tenant, Quotas: q.proto()})
		t = resp.GetTenant()
	case "set-quotas":
		var resp *fanoutv1.UpdateTenantResponse
		resp, err = admin.UpdateTenant(ctx, &fanoutv1.UpdateTenantRequest{TenantId: tenant, Quotas: q.proto()})
		t = resp.GetTenant()
	case "set-budget":
		p, ok := map[string]fanoutv1.BudgetPeriod{"none": fanoutv1.BudgetPeriod_BUDGET_PERIOD_NONE,
			"day": fanoutv1.BudgetPeriod_BUDGET_PERIOD_DAY, "month": fanoutv1.BudgetPeriod_BUDGET_PERIOD_MONTH}[period]
		if !ok {
			return fmt.Errorf("--period: must be day, month or none, got %q", period)
		}
		var resp *fanoutv1.UpdateTenantResponse
		resp, err = admin.UpdateTenant(ctx, &fanoutv1.UpdateTenantRequest{TenantId: tenant,
			Budget: &fanoutv1.TenantBudget{LimitTokens: limit, Period: p}})
		t = resp.GetTenant()
	case "show":
		var resp *fanoutv1.GetTenantResponse
		resp, err = admin.GetTenant(ctx, &fanoutv1.GetTenantRequest{TenantId: tenant})
		t = resp.GetTenant()
	}
	if err != nil {
		return err
	}
	printJSON(env.Stdout, t)
	return nil
}

func cmdKey(ctx context.Context, env *Env, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprint(env.Stderr, strings.TrimLeft(keyUsage, "\n"))
		return errUsage
	}
	verb := args[0]
	f := newFlags("key "+verb, keyUsage, env.Stderr)
	var af adminFlags
	af.register(f)
	var name, scopes string
	var admin bool
	var expires time.Duration
	var rpm int
	switch verb {
	case "create":
		f.StringVar(&name, "name", "", "what the key is for (≤ 128 bytes)")
		f.StringVar(&scopes, "scopes", "run,read,cancel", "a tenant key's scopes: any of run, read, cancel, audit, approve")
		f.BoolVar(&admin, "admin", false, "an admin key (global; manages tenants and keys) instead of a tenant's")
		f.DurationVar(&expires, "expires", 0, "the key stops working this long from now (0: never)")
		f.IntVar(&rpm, "requests-per-minute", 0, "this key's request rate (0: the tenant's key_requests_per_minute)")
	case "list", "revoke":
	default:
		return fmt.Errorf("unknown subcommand %q: want create, list or revoke", verb)
	}
	if err := parseFlags(f, leadingArg(args[1:]), env); err != nil {
		return err
	}
	ctx, client, done, err := af.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	switch verb {
	case "create":
		req := &fanoutv1.CreateKeyRequest{TenantId: af.tenant, Name: name, RequestsPerMinute: int32(rpm)}
		switch {
		case admin && af.tenant != "":
			return errors.New("--admin and --tenant: an admin key has no tenant")
		case admin:
			req.Scopes = []string{string(tenant.ScopeAdmin)}
		case af.tenant == "":
			return errors.New("--tenant is required (or --admin)")
		default:
			req.Scopes = strings.Split(scopes, ",")
		}
		if expires > 0 {
			req.ExpireTime = timestamppb.New(time.Now().Add(expires))
		}
		resp, err := client.CreateKey(ctx, req)
		if err != nil {
			return err
		}
		printJSON(env.Stdout, resp.GetKey())
		fmt.Fprintf(env.Stdout, "%s\n", resp.GetToken())
		fmt.Fprintln(env.Stderr, "The line above is the key's token: store it now (e.g. as FANOUT_API_KEY); it is not kept and will not be shown again.")
	case "list":
		resp, err := client.ListKeys(ctx, &fanoutv1.ListKeysRequest{TenantId: af.tenant})
		if err != nil {
			return err
		}
		for _, k := range resp.GetKeys() {
			printJSON(env.Stdout, k)
		}
	case "revoke":
		id, err := oneArg(f, "KEY_ID")
		if err != nil {
			return err
		}
		resp, err := client.RevokeKey(ctx, &fanoutv1.RevokeKeyRequest{KeyId: id})
		if err != nil {
			return err
		}
		printJSON(env.Stdout, resp.GetKey())
	}
	return nil
}
