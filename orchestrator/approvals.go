package orchestrator

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/tenant"
)

// Approvals lists and decides a tenant's writes that wait for approval.
// store.ToolCalls implements it; only an orchestrator's database login may
// decide (the database refuses any other).
type Approvals interface {
	// PendingWrites returns up to limit of the tenant's writes waiting for
	// approval (of run runID, or every run's when ""), oldest first, after
	// the cursor (afterCreated, afterCallID).
	PendingWrites(ctx context.Context, tenantID, runID string, afterCreated time.Time, afterCallID string,
		limit int) ([]runs.Write, error)
	// DecideAs records actor's decision on call callID of the tenant; for
	// an actor "key:ID", secret is the key's secret as its caller presented
	// it, which the database checks against the key's digest before it
	// names the key (see store.ToolCalls.DecideAs for its errors).
	DecideAs(ctx context.Context, tenantID, callID string, approve bool, actor, secret, reason string) (runs.Decision, error)
	// RunWrites returns up to limit of the writes of the tenant's run
	// runID, oldest first, after the cursor (afterCreated, afterCallID),
	// with their decisions.
	RunWrites(ctx context.Context, tenantID, runID string, afterCreated time.Time, afterCallID string,
		limit int) ([]runs.LoggedWrite, error)
}

// The bounds of the approval RPCs.
const (
	defaultApprovalsPage = 50
	maxApprovalsPage     = 200
	maxDecisionReason    = 1024
	maxCallIDBytes       = 64
)

// callsToken is what the opaque page token of ListApprovals and
// ListToolCalls holds: the listing's tenant and run, and its cursor.
type callsToken struct {
	RPC     string    `json:"p"` // the listing's: a token of one is refused by the other
	Tenant  string    `json:"t"`
	RunID   string    `json:"r"`
	Created time.Time `json:"c"`
	CallID  string    `json:"i"`
}

func (t callsToken) encode() string {
	raw, _ := json.Marshal(t) //nolint:errchkjson // strings and a time: cannot fail
	return base64.RawURLEncoding.EncodeToString(raw)
}

// callsPage is what a listing of calls (ListApprovals, ListToolCalls) was
// asked for, once checked: the caller's tenant, the cursor and the size.
type callsPage struct {
	rpc      string
	tenantID string
	tok      callsToken
	size     int
}

// callsListing checks a listing by rpc of the calls of run runID ("" for
// every run's, unless runRequired) with page size asked and page token
// token: every string of req, the run id, the size, the caller's tenant
// and a token that is rpc's for that tenant and run. Its errors are the
// statuses to answer.
func (s *Server) callsListing(ctx context.Context, rpc string, req textMessage, runID string, runRequired bool,
	asked int32, token string) (callsPage, error) {
	var v validator
	v.text("", req.ProtoReflect())
	if runRequired {
		requireRunID(&v, runID)
	} else if len(runID) > 128 {
		v.add("run_id", "must be at most 128 bytes, got %d", len(runID))
	}
	p := callsPage{rpc: rpc, size: pageSize(&v, asked, defaultApprovalsPage, maxApprovalsPage)}
	if err := v.err(); err != nil {
		return p, s.toStatus(ctx, err)
	}
	var err error
	if p.tenantID, err = callerTenant(ctx, "", ""); err != nil {
		return p, err
	}
	if token != "" {
		raw, err := base64.RawURLEncoding.DecodeString(token)
		if err == nil {
			err = json.Unmarshal(raw, &p.tok)
		}
		switch {
		case err != nil || p.tok.CallID == "" || p.tok.RPC != rpc || textProblem(p.tok.CallID+p.tok.Tenant+p.tok.RunID) != "":
			v.add("page_token", "is not a token from %s", rpc)
		case p.tok.Tenant != p.tenantID || p.tok.RunID != runID:
			v.add("page_token", "was issued for another tenant or run_id")
		}
	}
	if err := v.err(); err != nil {
		return p, s.toStatus(ctx, err)
	}
	return p, nil
}

// next is the token of the page after one that ended with the call
// (created, callID).
func (p callsPage) next(runID string, created time.Time, callID string) string {
	return callsToken{RPC: p.rpc, Tenant: p.tenantID, RunID: runID, Created: created, CallID: callID}.encode()
}

// ListApprovals implements fanoutv1.OrchestratorServiceServer.
func (s *Server) ListApprovals(ctx context.Context, req *fanoutv1.ListApprovalsRequest) (*fanoutv1.ListApprovalsResponse, error) {
	p, err := s.callsListing(ctx, "ListApprovals", req, req.GetRunId(), false, req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	tenantID, tok, size := p.tenantID, p.tok, p.size
	found, err := s.e.PendingWrites(ctx, tenantID, req.GetRunId(), tok.Created, tok.CallID, size+1)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &fanoutv1.ListApprovalsResponse{}
	for _, w := range found[:min(size, len(found))] {
		resp.Calls = append(resp.Calls, &fanoutv1.PendingToolCall{CallId: w.CallID, RunId: w.RunID, TaskId: w.TaskID,
			Tool: w.Tool, Preview: w.Preview, RequestedAt: timestamppb.New(w.CreatedAt),
			Deadline: timestamppb.New(w.ApprovalDeadline)})
	}
	resp.Calls = resp.Calls[:pageOf(resp.Calls)]
	if n := len(resp.Calls); n < len(found) {
		resp.NextPageToken = p.next(req.GetRunId(), found[n-1].CreatedAt, found[n-1].CallID)
	}
	return resp, nil
}

// ApproveToolCall implements fanoutv1.OrchestratorServiceServer.
func (s *Server) ApproveToolCall(ctx context.Context, req *fanoutv1.ApproveToolCallRequest) (*fanoutv1.ApproveToolCallResponse, error) {
	d, err := s.decide(ctx, req.GetCallId(), req.GetReason(), true, req)
	if err != nil {
		return nil, err
	}
	return &fanoutv1.ApproveToolCallResponse{Decision: d}, nil
}

// DenyToolCall implements fanoutv1.OrchestratorServiceServer.
func (s *Server) DenyToolCall(ctx context.Context, req *fanoutv1.DenyToolCallRequest) (*fanoutv1.DenyToolCallResponse, error) {
	d, err := s.decide(ctx, req.GetCallId(), req.GetReason(), false, req)
	if err != nil {
		return nil, err
	}
	return &fanoutv1.DenyToolCallResponse{Decision: d}, nil
}

// textMessage is a request whose strings validator.text checks.
type textMessage interface {
	ProtoReflect() protoreflect.Message
}

// decide records the caller's decision on callID: the caller's tenant's
// call only (NOT_FOUND otherwise, as for a run), logged with its key, and
// reported on the run as ApprovalDecided.
func (s *Server) decide(ctx context.Context, callID, reason string, approve bool, req textMessage) (*fanoutv1.ToolCallDecision, error) {
	var v validator
	v.text("", req.ProtoReflect())
	switch {
	case callID == "":
		v.add("call_id", "is required")
	case len(callID) > maxCallIDBytes:
		v.add("call_id", "must be at most %d bytes, got %d", maxCallIDBytes, len(callID))
	}
	if n := len(reason); n > maxDecisionReason {
		v.add("reason", "must be at most %d bytes, got %d", maxDecisionReason, n)
	}
	if err := v.err(); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	tenantID, err := callerTenant(ctx, "", "")
	if err != nil {
		return nil, err
	}
	p, _ := tenant.FromContext(ctx)
	d, err := s.e.Decide(ctx, tenantID, callID, approve, p.Actor(), presentedSecret(ctx, p.KeyID), reason)
	switch {
	case errors.Is(err, runs.ErrNotFound):
		return nil, status.Errorf(codes.NotFound, "call_id %q: no such call of tenant %q", callID, tenantID)
	case errors.Is(err, runs.ErrDecisionConflict), errors.Is(err, runs.ErrApprovalExpired), errors.Is(err, runs.ErrNotAwaitingApproval):
		why := "ALREADY_DECIDED"
		switch {
		case errors.Is(err, runs.ErrApprovalExpired):
			why = "APPROVAL_EXPIRED"
		case errors.Is(err, runs.ErrNotAwaitingApproval):
			why = "NOT_AWAITING_APPROVAL"
		}
		return nil, withDetails(codes.FailedPrecondition, fmt.Sprintf("call_id %q: %v", callID, err),
			&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
				Type: why, Subject: "call_id", Description: decisionWords(d)}}})
	case err != nil:
		return nil, s.toStatus(ctx, err)
	}
	return &fanoutv1.ToolCallDecision{CallId: d.CallID, RunId: d.RunID, TaskId: d.TaskID, Tool: d.Tool, Approved: d.Approved,
		Reason: d.Reason, Actor: d.Actor, DecidedAt: timestamppb.New(d.DecidedAt)}, nil
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

// decisionWords says what a call's recorded decision was, for an error.
func decisionWords(d runs.Decision) string {
	switch {
	case d.Actor == "":
		return fmt.Sprintf("the call is %s", d.State)
	case d.Approved:
		return fmt.Sprintf("approved by %s at %s", d.Actor, d.DecidedAt.Format(time.RFC3339))
	}
	return fmt.Sprintf("denied by %s at %s: %s", d.Actor, d.DecidedAt.Format(time.RFC3339), d.Reason)
}
