package orchestrator

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/tenant"
)

// TenantMetadataKey is the gRPC metadata key an anonymous caller (a node
// run with --auth none) names its tenant with. With API keys the tenant is
// the key's: a header naming another is PERMISSION_DENIED.
const TenantMetadataKey = "fanout-tenant-id"

const (
	// defaultPageSize and maxPageSize bound a ListRuns page (a page_size
	// above maxPageSize is lowered to it, as the API doc says); its encoded
	// size is bounded by MaxResponseBytes (pageOf).
	defaultPageSize = 50
	maxPageSize     = 100
	errorDomain     = "fanout.v1"
)

// Server is the gRPC adapter of an Engine: fanout.v1.OrchestratorService.
type Server struct {
	fanoutv1.UnimplementedOrchestratorServiceServer
	e   *Engine
	log *slog.Logger
}

var _ fanoutv1.OrchestratorServiceServer = (*Server)(nil)

// NewServer returns the service for e. Register it with
// fanoutv1.RegisterOrchestratorServiceServer on a grpc.Server built with
// ServerOptions.
func NewServer(e *Engine) *Server {
	return &Server{e: e, log: e.cfg.Logger}
}

// MaxHeaderBytes bounds a call's headers (HTTP/2 header list), which the
// server holds before it knows who sent them: an API key and a few ids need
// well under 1 KiB. gRPC's default is 16 MiB.
const MaxHeaderBytes = 64 << 10

// ServerOptions returns the options the gRPC server must have for e: a
// receive limit of twice the largest RunSpec e accepts. A request up to that
// size is decoded and refused with a field violation naming the spec; a
// bigger one is refused by gRPC (RESOURCE_EXHAUSTED) before it is decoded.
func ServerOptions(e *Engine) []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(2*e.cfg.MaxSpecBytes + 1024), grpc.MaxHeaderListSize(MaxHeaderBytes)}
}

// Shutdown stops accepting runs and waits for the runs this replica drives
// to end; when ctx ends first they are cancelled. See Engine.Shutdown.
func (s *Server) Shutdown(ctx context.Context) error { return s.e.Shutdown(ctx) }

// Run implements fanoutv1.OrchestratorServiceServer.
func (s *Server) Run(req *fanoutv1.RunRequest, stream grpc.ServerStreamingServer[fanoutv1.RunResponse]) error {
	ctx := stream.Context()
	spec, err := specOfCaller(ctx, req.GetSpec())
	if err != nil {
		return err
	}
	run, created, err := s.e.Submit(ctx, spec)
	if err != nil {
		return s.toStatus(ctx, err)
	}
	tenantID := run.GetTenantId()
	err = s.e.Watch(ctx, tenantID, run.GetRunId(), 0, func(ev *fanoutv1.RunEvent) error {
		return stream.Send(&fanoutv1.RunResponse{Event: servedEvent(ev, tenantID)})
	})
	if err != nil && ctx.Err() != nil && created {
		// The caller went away: the run it created goes with it. A caller
		// that joined an existing run by its key does not own it.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if _, cerr := s.e.Cancel(cctx, tenantID, run.GetRunId(), "caller cancelled Run"); cerr != nil {
			s.log.ErrorContext(ctx, "cancel run of departed caller", "run_id", run.GetRunId(), "err", cerr)
		}
	}
	if err != nil {
		return s.toStatus(ctx, err)
	}
	return nil
}

// StartRun implements fanoutv1.OrchestratorServiceServer.
func (s *Server) StartRun(ctx context.Context, req *fanoutv1.StartRunRequest) (*fanoutv1.StartRunResponse, error) {
	spec, err := specOfCaller(ctx, req.GetSpec())
	if err != nil {
		return nil, err
	}
	if req.GetDryRun() {
		q, err := s.e.quote(ctx, spec)
		if err != nil {
			return nil, s.toStatus(ctx, err)
		}
		return &fanoutv1.StartRunResponse{Quote: q}, nil
	}
	run, _, q, err := s.e.submit(ctx, spec, nil, req.GetReserveQuote())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &fanoutv1.StartRunResponse{RunId: run.GetRunId(), Quote: q}, nil
}

// quoteShortStatus is a reserve_quote the tenant's budget does not cover:
// RESOURCE_EXHAUSTED with the figures, and the quote riding along for the
// caller to print.
func quoteShortStatus(short *QuoteNotCoveredError) error {
	return withDetails(codes.ResourceExhausted, short.Error(),
		&errdetails.ErrorInfo{Reason: "BUDGET_EXHAUSTED", Domain: errorDomain},
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
			Subject: "tenant:" + short.Tenant + "/budget",
			Description: fmt.Sprintf("%d tokens available; the quote needs %d (min of forecast %d and limit %d)",
				short.Quote.GetTenantAvailableTokens(), quoteHold(short.Quote), short.Quote.GetForecastTokens(),
				short.Quote.GetLimitTokens())}}},
		protoadapt.MessageV1Of(short.Quote))
}

// ForkRun implements fanoutv1.OrchestratorServiceServer.
func (s *Server) ForkRun(ctx context.Context, req *fanoutv1.ForkRunRequest) (*fanoutv1.ForkRunResponse, error) {
	tenantID, err := callerTenant(ctx, "", "")
	if err != nil {
		return nil, err
	}
	f, err := s.e.Fork(ctx, tenantID, req)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &fanoutv1.ForkRunResponse{RunId: f.Run.GetRunId(), ReusedTaskIds: f.Reused, Quote: f.Quote}, nil
}

// WatchRun implements fanoutv1.OrchestratorServiceServer.
func (s *Server) WatchRun(req *fanoutv1.WatchRunRequest, stream grpc.ServerStreamingServer[fanoutv1.WatchRunResponse]) error {
	ctx := stream.Context()
	var v validator
	v.text("", req.ProtoReflect()) // every string reaches PostgreSQL or a log
	requireRunID(&v, req.GetRunId())
	if req.GetAfterSequence() < 0 {
		v.add("after_sequence", "must be >= 0, got %d", req.GetAfterSequence())
	}
	if err := v.err(); err != nil {
		return s.toStatus(ctx, err)
	}
	tenantID, err := callerTenant(ctx, "", "")
	if err != nil {
		return err
	}
	err = s.e.Watch(ctx, tenantID, req.GetRunId(), req.GetAfterSequence(), func(ev *fanoutv1.RunEvent) error {
		return stream.Send(&fanoutv1.WatchRunResponse{Event: servedEvent(ev, tenantID)})
	})
	return s.toStatus(ctx, err)
}

// GetRun implements fanoutv1.OrchestratorServiceServer.
func (s *Server) GetRun(ctx context.Context, req *fanoutv1.GetRunRequest) (*fanoutv1.GetRunResponse, error) {
	var v validator
	v.text("", req.ProtoReflect()) // every string reaches PostgreSQL or a log
	requireRunID(&v, req.GetRunId())
	if err := v.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	tenantID, err := callerTenant(ctx, "", "")
	if err != nil {
		return nil, err
	}
	run, err := s.e.Get(ctx, tenantID, req.GetRunId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	cutRun(run, tenantID)
	return &fanoutv1.GetRunResponse{Run: run}, nil
}

// CancelRun implements fanoutv1.OrchestratorServiceServer.
func (s *Server) CancelRun(ctx context.Context, req *fanoutv1.CancelRunRequest) (*fanoutv1.CancelRunResponse, error) {
	var v validator
	v.text("", req.ProtoReflect()) // every string reaches PostgreSQL or a log
	requireRunID(&v, req.GetRunId())
	v.reason(req.GetReason())
	if err := v.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	tenantID, err := callerTenant(ctx, "", "")
	if err != nil {
		return nil, err
	}
	cause := "cancelled by caller"
	if req.GetReason() != "" {
		cause += ": " + req.GetReason()
	}
	run, err := s.e.Cancel(ctx, tenantID, req.GetRunId(), cause)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	p, _ := tenant.FromContext(ctx)
	cancelView(run, tenantID, p.Has(tenant.ScopeRead))
	return &fanoutv1.CancelRunResponse{Run: run}, nil
}

// cancelView makes run what CancelRun answers, in place: cut to the
// response's size (cutRun). What the run holds (its spec, result and
// summaries) is for keys that may read it: a cancel-only key learns what
// became of the run and how many tasks it has, and is given no page token,
// which only ListRunTasks (a read) could follow.
func cancelView(run *fanoutv1.Run, tenantID string, readable bool) {
	if !readable {
		summarize(run)
	}
	cutRun(run, tenantID)
	if !readable {
		run.TasksNextPageToken = ""
	}
}

// pageToken is what ListRuns' opaque page token holds.
type pageToken struct {
	Tenant  string    `json:"t"`
	State   int32     `json:"s"`
	Created time.Time `json:"c"`
	RunID   string    `json:"r"`
}

// ListRuns implements fanoutv1.OrchestratorServiceServer.
func (s *Server) ListRuns(ctx context.Context, req *fanoutv1.ListRunsRequest) (*fanoutv1.ListRunsResponse, error) {
	var v validator
	v.text("", req.ProtoReflect()) // every string reaches PostgreSQL or a log
	if n := len(req.GetTenantId()); n > maxTenantIDBytes {
		v.add("tenant_id", "must be at most %d bytes, got %d", maxTenantIDBytes, n)
	}
	if err := v.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	tenantID, err := callerTenant(ctx, "tenant_id", req.GetTenantId())
	if err != nil {
		return nil, err
	}
	size := pageSize(&v, req.GetPageSize(), defaultPageSize, maxPageSize)
	if _, ok := fanoutv1.RunState_name[int32(req.GetState())]; !ok {
		v.add("state", "unknown run state %d", req.GetState())
	}
	var tok pageToken
	if req.GetPageToken() != "" {
		raw, err := base64.RawURLEncoding.DecodeString(req.GetPageToken())
		if err == nil {
			err = json.Unmarshal(raw, &tok)
		}
		switch {
		case err != nil || tok.RunID == "" || textProblem(tok.RunID+tok.Tenant) != "":
			v.add("page_token", "is not a token from ListRuns")
		case tok.Tenant != tenantID || tok.State != int32(req.GetState()):
			v.add("page_token", "was issued for another tenant_id or state")
		}
	}
	if err := v.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	found, err := s.e.List(ctx, tenantID, req.GetState(), tok.Created, tok.RunID, size+1)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	for _, r := range found {
		summarize(r)
		cutRun(r, tenantID)
	}
	resp := &fanoutv1.ListRunsResponse{Runs: found[:min(size, len(found))]}
	resp.Runs = resp.Runs[:pageOf(resp.Runs)]
	if len(resp.Runs) < len(found) {
		last := resp.Runs[len(resp.Runs)-1]
		raw, err := json.Marshal(pageToken{Tenant: tenantID, State: int32(req.GetState()),
			Created: last.GetCreatedAt().AsTime(), RunID: last.GetRunId()})
		if err != nil {
			return nil, s.toStatus(ctx, err)
		}
		resp.NextPageToken = base64.RawURLEncoding.EncodeToString(raw)
	}
	return resp, nil
}

// pageSize is a list request's page_size: its default when 0, lowered to
// most, and a violation when negative.
func pageSize(v *validator, asked int32, def, most int) int {
	switch size := int(asked); {
	case size < 0:
		v.add("page_size", "must be >= 0, got %d", size)
		return def
	case size == 0:
		return def
	default:
		return min(size, most)
	}
}

// summarize clears what a ListRuns summary leaves out: the spec, the joined
// result and the tasks' summaries (GetRun has them). The store does not read
// them for a list; this keeps the response's contract whatever the store.
func summarize(r *fanoutv1.Run) {
	r.Spec, r.Result = nil, nil
	for _, t := range r.GetTasks() {
		t.Summary = nil
	}
}

func requireRunID(v *validator, id string) {
	if id == "" {
		v.add("run_id", "is required")
	} else if len(id) > 128 {
		v.add("run_id", "must be at most 128 bytes, got %d", len(id))
	}
}

// callerTenant returns the tenant the call is scoped to: its credential's
// (tenant.Principal), and nothing else's. field is the request field that
// names a tenant (asked, "" if none): naming another tenant there, or in the
// fanout-tenant-id header, is PERMISSION_DENIED, and nothing is read or
// written. An anonymous caller (--auth none) is the tenant it names (the
// field, else the header, else "default"). A call with no principal (a
// server built without the auth interceptors) is refused: fail closed.
func callerTenant(ctx context.Context, field, asked string) (string, error) {
	// A malformed tenant is the caller's mistake whoever it is: say so
	// (INVALID_ARGUMENT) before comparing it with anyone's.
	if why := textProblem(asked); why != "" {
		return "", badField(field, why)
	} else if len(asked) > maxTenantIDBytes {
		return "", badField(field, fmt.Sprintf("must be at most %d bytes, got %d", maxTenantIDBytes, len(asked)))
	}
	p, ok := tenant.FromContext(ctx)
	if !ok {
		return "", status.Error(codes.Unauthenticated, "no credential: this server authenticates no caller")
	}
	header := ""
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(TenantMetadataKey); len(v) > 0 {
			header = v[0]
		}
	}
	if p.Anonymous {
		switch {
		case asked != "" && header != "" && asked != header:
			return "", denied(field, fmt.Sprintf("names tenant %q but the %s header names %q", asked, TenantMetadataKey, header))
		case asked != "":
			return asked, nil
		case header != "":
			return header, nil
		}
		return "default", nil
	}
	if p.Tenant == "" {
		return "", status.Error(codes.PermissionDenied,
			"an admin key manages tenants and keys; call with a key of the tenant")
	}
	if asked != "" && asked != p.Tenant {
		return "", denied(field, fmt.Sprintf("names tenant %q; this key's tenant is %q", asked, p.Tenant))
	}
	if header != "" && header != p.Tenant {
		return "", denied(TenantMetadataKey, fmt.Sprintf("names tenant %q; this key's tenant is %q", header, p.Tenant))
	}
	return p.Tenant, nil
}

// specOfCaller returns spec with its tenant_id set to the caller's tenant
// (callerTenant), or the PERMISSION_DENIED status when it names another.
func specOfCaller(ctx context.Context, spec *fanoutv1.RunSpec) (*fanoutv1.RunSpec, error) {
	tenantID, err := callerTenant(ctx, "spec.tenant_id", spec.GetTenantId())
	if err != nil || spec == nil {
		return spec, err
	}
	if spec.GetTenantId() != tenantID {
		spec = proto.CloneOf(spec)
		spec.TenantId = tenantID
	}
	return spec, nil
}

func badField(field, why string) error {
	return withDetails(codes.InvalidArgument, field+": "+why, &errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: why}}})
}

func denied(field, why string) error {
	return withDetails(codes.PermissionDenied, field+": "+why, &errdetails.ErrorInfo{
		Reason: "TENANT_MISMATCH", Domain: errorDomain, Metadata: map[string]string{"field": field}})
}

// toStatus is the one mapping from the engine's errors to gRPC status.
// Unexpected errors reach the caller as Internal "internal error" and are
// logged with their details.
func (s *Server) toStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	var ve budget.ValidationErrors // the request's; a ledger's own *budget.ValidationError is a bug (Internal)
	var slow *SlowReaderError
	var quota *tenant.QuotaError
	var refused *runs.ContinueError
	var short *QuoteNotCoveredError
	switch {
	case errors.As(err, &short):
		return quoteShortStatus(short)
	case errors.As(err, &refused):
		return continueStatus(refused)
	case errors.Is(err, errNoToolCallStore), errors.Is(err, errNoSpendReader), errors.Is(err, errNoRecordedTasks):
		return status.Error(codes.Unimplemented, err.Error())
	case errors.As(err, &quota):
		return withDetails(codes.ResourceExhausted, quota.Error(), &errdetails.QuotaFailure{
			Violations: []*errdetails.QuotaFailure_Violation{{Subject: "tenant:" + quota.Tenant + "/" + quota.Quota,
				Description: fmt.Sprintf("at most %d; %d in use", quota.Limit, quota.Used)}}})
	case errors.As(err, &slow):
		after := strconv.FormatInt(slow.After, 10)
		return withDetails(codes.ResourceExhausted, slow.Error(),
			&errdetails.ErrorInfo{Reason: "WATCH_READER_BEHIND", Domain: errorDomain, Metadata: map[string]string{
				"after_sequence": after, "max_lag_events": strconv.FormatInt(slow.MaxLag, 10),
				"slow_after": slow.For.String()}},
			&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: "watch-lag",
				Description: fmt.Sprintf("a stream may stay more than %d events behind its run for less than %v; resume with after_sequence %s",
					slow.MaxLag, slow.For, after)}}})
	case errors.As(err, &ve):
		br := &errdetails.BadRequest{}
		for _, fv := range ve.Reported() {
			br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{
				Field: fv.Field, Description: fv.Reason})
		}
		if ve.OverCap() {
			qf := &errdetails.QuotaFailure{}
			for _, fv := range ve.Reported() {
				qf.Violations = append(qf.Violations, &errdetails.QuotaFailure_Violation{
					Subject: fv.Field, Description: fv.Reason})
			}
			return withDetails(codes.ResourceExhausted, ve.Error(), qf, br)
		}
		return withDetails(codes.InvalidArgument, ve.Error(), br)
	case errors.Is(err, budget.ErrExhausted):
		return withDetails(codes.ResourceExhausted, err.Error(),
			&errdetails.ErrorInfo{Reason: "BUDGET_EXHAUSTED", Domain: errorDomain})
	case errors.Is(err, runs.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, ErrSpecMismatch):
		return withDetails(codes.FailedPrecondition, err.Error(), &errdetails.PreconditionFailure{
			Violations: []*errdetails.PreconditionFailure_Violation{{
				Type: "IDEMPOTENCY_KEY", Subject: "spec.idempotency_key",
				Description: "the key was used before with a different spec"}}})
	case errors.Is(err, ErrShuttingDown):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, budget.ErrUnavailable):
		// The database outlasted the store's retries: the call may be
		// tried again. Its error names the server, so it stays in the log.
		s.log.WarnContext(ctx, "database unavailable", "err", err)
		return status.Error(codes.Unavailable, "the database is unavailable; try again")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "call cancelled")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "deadline exceeded")
	}
	if st, ok := status.FromError(err); ok {
		return st.Err() // already a status, e.g. from stream.Send
	}
	s.log.ErrorContext(ctx, "internal error", "err", err)
	return status.Error(codes.Internal, "internal error")
}

func withDetails(code codes.Code, msg string, details ...protoadapt.MessageV1) error {
	st, err := status.New(code, msg).WithDetails(details...)
	if err != nil {
		return status.Error(code, msg)
	}
	return st.Err()
}
