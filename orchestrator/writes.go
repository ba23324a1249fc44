package orchestrator

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// ListToolCalls implements fanoutv1.OrchestratorServiceServer: the writes
// of one of the caller's tenant's runs, with the decisions on them. A run
// of another tenant (or none) is NOT_FOUND, as for GetRun.
func (s *Server) ListToolCalls(ctx context.Context, req *fanoutv1.ListToolCallsRequest) (*fanoutv1.ListToolCallsResponse, error) {
	p, err := s.callsListing(ctx, "ListToolCalls", req, req.GetRunId(), true, req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	tenantID, tok, size := p.tenantID, p.tok, p.size
	found, err := s.e.RunWrites(ctx, tenantID, req.GetRunId(), tok.Created, tok.CallID, size+1)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if len(found) == 0 && req.GetPageToken() == "" {
		// No writes, or no such run of the tenant: only the run says which.
		if _, err := s.e.Get(ctx, tenantID, req.GetRunId()); err != nil {
			return nil, s.toStatus(ctx, err)
		}
	}
	resp := &fanoutv1.ListToolCallsResponse{}
	for _, w := range found[:min(size, len(found))] {
		resp.Calls = append(resp.Calls, toolCallProto(w))
	}
	resp.Calls = resp.Calls[:pageOf(resp.Calls)] // a call's error may be up to 1 MiB
	if n := len(resp.Calls); n < len(found) {
		resp.NextPageToken = p.next(req.GetRunId(), found[n-1].CreatedAt, found[n-1].CallID)
	}
	return resp, nil
}

func toolCallProto(w runs.LoggedWrite) *fanoutv1.ToolCall {
	c := &fanoutv1.ToolCall{CallId: w.CallID, TaskId: w.TaskID, Attempt: int32(min(w.Attempt, 1<<30)), //nolint:gosec // clamped
		Iteration: int32(min(w.Iteration, 1<<30)), CallIndex: int32(min(w.Index, 1<<30)), //nolint:gosec // clamped
		Server: w.Server, Tool: w.Tool, State: string(w.State), Error: w.Error, Preview: w.Preview,
		ResultBytes: w.ResultBytes, CreatedAt: timestamppb.New(w.CreatedAt),
		ResolvedAt: optionalTime(w.ResolvedAt), ApprovalDeadline: optionalTime(w.ApprovalDeadline)}
	if d := w.Decision; d != nil {
		c.Decision = &fanoutv1.ToolCallDecision{CallId: d.CallID, RunId: d.RunID, TaskId: d.TaskID, Tool: d.Tool,
			Approved: d.Approved, Reason: d.Reason, Actor: d.Actor, DecidedAt: timestamppb.New(d.DecidedAt)}
	}
	return c
}

// optionalTime is t as a timestamp, nil for the zero time (not set).
func optionalTime(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}
