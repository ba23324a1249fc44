package orchestrator

import (
	"context"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/tenant"
)

// ContinueRun implements fanoutv1.OrchestratorServiceServer
// (docs/budget.md#continue).
func (s *Server) ContinueRun(ctx context.Context, req *fanoutv1.ContinueRunRequest) (*fanoutv1.ContinueRunResponse, error) {
	var v validator
	v.text("", req.ProtoReflect())
	requireRunID(&v, req.GetRunId())
	if n := req.GetAddTokens(); n <= 0 {
		v.add("add_tokens", "must be positive, got %d", n)
	}
	switch n := len(req.GetIdempotencyKey()); {
	case n == 0 && !req.GetDryRun():
		v.add("idempotency_key", "is required (1 to %d bytes): a retry must not add twice", maxIdempotencyKeyBytes)
	case n > maxIdempotencyKeyBytes:
		v.add("idempotency_key", "must be at most %d bytes, got %d", maxIdempotencyKeyBytes, n)
	}
	v.reason(req.GetReason())
	if err := v.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	tenantID, err := callerTenant(ctx, "", "")
	if err != nil {
		return nil, err
	}
	p, _ := tenant.FromContext(ctx)
	actor := "anonymous"
	if p.KeyID != "" {
		actor = "key:" + p.KeyID
	}
	c := ContinueParams{TenantID: tenantID, RunID: req.GetRunId(), Key: req.GetIdempotencyKey(), Actor: actor,
		Reason: req.GetReason(), Add: req.GetAddTokens(), DryRun: req.GetDryRun() || req.GetReserveQuote()}
	run, done, q, err := s.e.Continue(ctx, c)
	if err == nil && req.GetReserveQuote() {
		// A continuation holds nothing of its tenant beyond its synthesis
		// allowance: reserve_quote checks that the tenant covers the
		// forecast, then continues.
		if !q.GetTenantCovers() {
			return nil, withDetails(codes.ResourceExhausted,
				"the tenant's budget does not cover the continuation's forecast (dry_run shows the quote)",
				&errdetails.ErrorInfo{Reason: "QUOTE_NOT_COVERED", Domain: errorDomain})
		}
		c.DryRun = false
		run, done, _, err = s.e.Continue(ctx, c)
	}
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	cancelView(run, tenantID, p.Has(tenant.ScopeRead))
	return &fanoutv1.ContinueRunResponse{Run: run, Continuation: done, Quote: q}, nil
}

// continueStatus is the status of a continuation the ledger refused.
func continueStatus(refused *runs.ContinueError) error {
	code, kind := codes.FailedPrecondition, "RUN_STATE"
	switch refused.Outcome {
	case "conflict":
		kind = "IDEMPOTENCY_KEY"
	case "over_cap", "exhausted":
		return withDetails(codes.ResourceExhausted, refused.Error(), &errdetails.QuotaFailure{
			Violations: []*errdetails.QuotaFailure_Violation{{Subject: "add_tokens", Description: refused.Error()}}})
	case "too_small":
		kind = "ADD_TOKENS"
	}
	return withDetails(code, refused.Error(), &errdetails.PreconditionFailure{
		Violations: []*errdetails.PreconditionFailure_Violation{{Type: kind, Subject: "run", Description: refused.Error()}}})
}
