// Package admin is fanout.v1.AdminService: tenants, their quotas and
// budgets, and API keys, for admin keys only. It is the gRPC adapter over
// tenant.Directory and budget.TenantLedger (which store implements), with
// one mapping of their errors to status codes (toStatus); who the caller is
// comes from the tenant.Principal the authenticator (package auth) put in
// the call's context.
package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fanout/fanout/auth"
	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/tenant"
)

// Server is fanout.v1.AdminService: tenants and keys, for admin keys
// only. Register it with fanoutv1.RegisterAdminServiceServer on the server
// the auth.Authenticator guards.
type Server struct {
	fanoutv1.UnimplementedAdminServiceServer
	keys   tenant.Directory
	ledger budget.TenantLedger
	log    *slog.Logger
}

var _ fanoutv1.AdminServiceServer = (*Server)(nil)

// NewServer returns the admin service over keys and ledger (whose
// TenantAccount and SetTenantBudget serve the budgets). log nil:
// slog.Default().
func NewServer(keys tenant.Directory, ledger budget.TenantLedger, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	return &Server{keys: keys, ledger: ledger, log: log}
}

// tenantMinReservation is a tenant budget's minimum: below it the tenant
// is exhausted and every run of it ends (orchestrator's default run
// minimum).
const tenantMinReservation = 256

// MaxBudgetTokens bounds a tenant budget's limit_tokens: 10^15 tokens, far
// above any real budget, so that the ledger's sums of limits, reservations
// and spend stay far from int64's range (9.2 * 10^18).
const MaxBudgetTokens = 1_000_000_000_000_000

// invalid is INVALID_ARGUMENT with a BadRequest naming field, as admin.proto
// promises for every refusal of an argument.
func invalid(field, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	st, err := status.New(codes.InvalidArgument, msg).WithDetails(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: msg}}})
	if err != nil {
		return status.Error(codes.InvalidArgument, msg)
	}
	return st.Err()
}

// checkText refuses text PostgreSQL cannot store (a NUL, invalid UTF-8),
// which it would refuse only as an encoding error, with no field named.
func checkText(field, v string) error {
	if strings.ContainsRune(v, 0) || !utf8.ValidString(v) {
		return invalid(field, "%s: must be UTF-8 text without NUL", field)
	}
	return nil
}

// actor returns the calling admin's actor, or PERMISSION_DENIED.
func actor(ctx context.Context) (string, error) {
	p, ok := tenant.FromContext(ctx)
	if !ok || !p.Admin() {
		return "", status.Error(codes.PermissionDenied, "AdminService needs an admin key")
	}
	return p.Actor(), nil
}

// keyActor is a tenant.Directory that can act for an API key by handing
// the database the secret its caller presented (store.Keys): the database
// logs a key as the actor only if that secret matches the key's digest.
type keyActor interface {
	WithActorSecret(secret string) tenant.Directory
}

// acting returns the calling admin's actor and the directory to change
// things through as that actor: for a key, one that presents the key's
// secret, as the caller sent it, to the database. PERMISSION_DENIED for a
// caller that is not an admin.
func (s *Server) acting(ctx context.Context) (string, tenant.Directory, error) {
	who, err := actor(ctx)
	if err != nil {
		return "", nil, err
	}
	p, _ := tenant.FromContext(ctx)
	if ka, ok := s.keys.(keyActor); ok && p.KeyID != "" {
		return who, ka.WithActorSecret(presentedSecret(ctx, p.KeyID)), nil
	}
	return who, s.keys, nil
}

// presentedSecret is the secret of the API key the call presented for key
// keyID, which the authenticator verified; "" without one. Never log it or
// put it in an error.
func presentedSecret(ctx context.Context, keyID string) string {
	if keyID == "" {
		return ""
	}
	secret, _ := tenant.PresentedSecret(ctx)
	return secret
}

// toStatus maps the store's and ledger's errors to a status: the one place
// that does.
func (s *Server) toStatus(ctx context.Context, err error) error {
	var ae *tenant.AdminError
	var ve *budget.ValidationError
	switch {
	case errors.As(err, &ae) && errors.Is(err, tenant.ErrAdminInvalid):
		return invalid(ae.Field, "%s", ae.Message)
	case errors.As(err, &ve):
		field := ve.Field
		if !strings.HasPrefix(field, "budget") {
			field = "budget." + field
		}
		return invalid(field, "%s: %s", field, ve.Reason)
	case errors.Is(err, tenant.ErrActorRefused):
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, tenant.ErrTenantNotFound), errors.Is(err, tenant.ErrKeyNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, tenant.ErrTenantExists), errors.Is(err, tenant.ErrKeyExists):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, budget.ErrUnavailable):
		s.log.WarnContext(ctx, "admin call: database unavailable", "err", err)
		return status.Error(codes.Unavailable, "the database is unavailable; try again")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "call cancelled")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "deadline exceeded")
	}
	s.log.ErrorContext(ctx, "admin call", "err", err)
	return status.Error(codes.Internal, "internal error")
}

func quotasFromProto(q *fanoutv1.TenantQuotas) tenant.Quotas {
	if q == nil {
		return tenant.Quotas{}
	}
	return tenant.Quotas{MaxRunTokens: q.MaxRunTokens, MaxConcurrentRuns: q.MaxConcurrentRuns,
		MaxTasksInFlight: q.MaxTasksInFlight, KeyRequestsPerMinute: q.KeyRequestsPerMinute, Headroom: q.Headroom}
}

var periodToProto = map[budget.PeriodKind]fanoutv1.BudgetPeriod{
	budget.PeriodNone: fanoutv1.BudgetPeriod_BUDGET_PERIOD_NONE, budget.PeriodDay: fanoutv1.BudgetPeriod_BUDGET_PERIOD_DAY,
	budget.PeriodMonth: fanoutv1.BudgetPeriod_BUDGET_PERIOD_MONTH,
}

func optTime(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return timestamppb.New(*t)
}

// tenant reads tenant id with its budget (none when the ledger has none).
func (s *Server) tenant(ctx context.Context, t tenant.Tenant) (*fanoutv1.Tenant, error) {
	out := &fanoutv1.Tenant{TenantId: t.ID, CreateTime: timestamppb.New(t.CreatedAt), UpdateTime: timestamppb.New(t.UpdatedAt),
		Quotas: &fanoutv1.TenantQuotas{MaxRunTokens: t.MaxRunTokens, MaxConcurrentRuns: t.MaxConcurrentRuns,
			MaxTasksInFlight: t.MaxTasksInFlight, KeyRequestsPerMinute: t.KeyRequestsPerMinute, Headroom: t.Headroom}}
	acct, err := s.ledger.TenantAccount(ctx, t.ID)
	switch {
	case errors.Is(err, budget.ErrNotFound):
		return out, nil
	case err != nil:
		return nil, err
	}
	out.Budget = &fanoutv1.TenantBudgetState{LimitTokens: acct.PeriodLimit, Period: periodToProto[acct.Period.Kind],
		AvailableTokens: acct.Available(), SpentInPeriod: acct.PeriodSpent}
	if !acct.PeriodEnd.IsZero() {
		out.Budget.PeriodEnd = timestamppb.New(acct.PeriodEnd)
	}
	return out, nil
}

// CreateTenant implements fanoutv1.AdminServiceServer.
func (s *Server) CreateTenant(ctx context.Context, req *fanoutv1.CreateTenantRequest) (*fanoutv1.CreateTenantResponse, error) {
	who, dir, err := s.acting(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkText("tenant_id", req.GetTenantId()); err != nil {
		return nil, err
	}
	t, err := dir.CreateTenant(ctx, who, req.GetTenantId(), quotasFromProto(req.GetQuotas()))
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	pt, err := s.tenant(ctx, t)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &fanoutv1.CreateTenantResponse{Tenant: pt}, nil
}

// UpdateTenant implements fanoutv1.AdminServiceServer. The quotas and the
// budget are validated, then written in one transaction: a refused request
// changes nothing.
func (s *Server) UpdateTenant(ctx context.Context, req *fanoutv1.UpdateTenantRequest) (*fanoutv1.UpdateTenantResponse, error) {
	who, dir, err := s.acting(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkText("tenant_id", req.GetTenantId()); err != nil {
		return nil, err
	}
	if req.GetQuotas() == nil && req.GetBudget() == nil {
		return nil, invalid("quotas", "quotas, budget: set at least one")
	}
	p := tenant.UpdateTenantParams{Actor: who, TenantID: req.GetTenantId()}
	if q := req.GetQuotas(); q != nil {
		quotas := quotasFromProto(q)
		p.Quotas = &quotas
	}
	if b := req.GetBudget(); b != nil {
		var kind budget.PeriodKind
		for k, v := range periodToProto {
			if v == b.GetPeriod() {
				kind = k
			}
		}
		if kind == "" {
			return nil, invalid("budget.period", "budget.period: must be NONE, DAY or MONTH")
		}
		if l := b.GetLimitTokens(); l <= 0 || l > MaxBudgetTokens {
			return nil, invalid("budget.limit_tokens", "budget.limit_tokens: must be in 1..%d, got %d", int64(MaxBudgetTokens), l)
		}
		// The tenant is exhausted (its runs end) once it cannot grant a
		// call's worth: the server's default minimum reservation, not 1.
		p.Budget = &budget.TenantBudget{Limit: b.GetLimitTokens(), Period: budget.Period{Kind: kind},
			MinReservation: min(tenantMinReservation, b.GetLimitTokens())}
	}
	t, err := dir.UpdateTenant(ctx, p)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	pt, err := s.tenant(ctx, t)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &fanoutv1.UpdateTenantResponse{Tenant: pt}, nil
}

// GetTenant implements fanoutv1.AdminServiceServer.
func (s *Server) GetTenant(ctx context.Context, req *fanoutv1.GetTenantRequest) (*fanoutv1.GetTenantResponse, error) {
	if _, err := actor(ctx); err != nil {
		return nil, err
	}
	if err := checkText("tenant_id", req.GetTenantId()); err != nil {
		return nil, err
	}
	t, err := s.keys.Tenant(ctx, req.GetTenantId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	pt, err := s.tenant(ctx, t)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &fanoutv1.GetTenantResponse{Tenant: pt}, nil
}

func keyToProto(k tenant.APIKey) *fanoutv1.ApiKey {
	return &fanoutv1.ApiKey{KeyId: k.ID, TenantId: k.TenantID, Name: k.Name, Scopes: k.Scopes, RequestsPerMinute: k.RequestsPerMinute,
		CreateTime: timestamppb.New(k.CreatedAt), CreatedBy: k.CreatedBy, ExpireTime: optTime(k.ExpiresAt),
		RevokeTime: optTime(k.RevokedAt), RevokedBy: k.RevokedBy}
}

// CreateKey implements fanoutv1.AdminServiceServer.
func (s *Server) CreateKey(ctx context.Context, req *fanoutv1.CreateKeyRequest) (*fanoutv1.CreateKeyResponse, error) {
	who, dir, err := s.acting(ctx)
	if err != nil {
		return nil, err
	}
	for _, f := range []struct{ name, v string }{{"tenant_id", req.GetTenantId()}, {"name", req.GetName()}} {
		if err := checkText(f.name, f.v); err != nil {
			return nil, err
		}
	}
	for _, sc := range req.GetScopes() {
		if err := checkText("scopes", sc); err != nil {
			return nil, err
		}
	}
	// A time set is a time: the zero instant (0001-01-01T00:00:00Z) is in
	// the past like any other, never "no expiry" (which is no expire_time).
	// The database checks again against its own now().
	if e := req.GetExpireTime(); e != nil {
		if e.CheckValid() != nil {
			return nil, invalid("expire_time", "expire_time: must be a valid time in years 1..9999")
		}
		if at := e.AsTime(); !at.After(time.Now()) {
			return nil, invalid("expire_time", "expire_time: must be after now, got %s", at.Format(time.RFC3339))
		}
	}
	id, token, digest, err := auth.NewKey()
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	p := tenant.CreateKeyParams{Actor: who, KeyID: id, TenantID: req.GetTenantId(), Name: req.GetName(), Scopes: req.GetScopes(),
		SecretSHA256: digest, RequestsPerMinute: req.GetRequestsPerMinute()}
	if req.GetExpireTime() != nil {
		p.ExpiresAt = req.GetExpireTime().AsTime()
	}
	k, err := dir.CreateKey(ctx, p)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &fanoutv1.CreateKeyResponse{Key: keyToProto(k), Token: token}, nil
}

// ListKeys implements fanoutv1.AdminServiceServer.
func (s *Server) ListKeys(ctx context.Context, req *fanoutv1.ListKeysRequest) (*fanoutv1.ListKeysResponse, error) {
	if _, err := actor(ctx); err != nil {
		return nil, err
	}
	if err := checkText("tenant_id", req.GetTenantId()); err != nil {
		return nil, err
	}
	ks, err := s.keys.ListKeys(ctx, req.GetTenantId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	out := &fanoutv1.ListKeysResponse{}
	for _, k := range ks {
		out.Keys = append(out.Keys, keyToProto(k))
	}
	return out, nil
}

// RevokeKey implements fanoutv1.AdminServiceServer.
func (s *Server) RevokeKey(ctx context.Context, req *fanoutv1.RevokeKeyRequest) (*fanoutv1.RevokeKeyResponse, error) {
	who, dir, err := s.acting(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkText("key_id", req.GetKeyId()); err != nil {
		return nil, err
	}
	k, err := dir.RevokeKey(ctx, who, req.GetKeyId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &fanoutv1.RevokeKeyResponse{Key: keyToProto(k)}, nil
}
