package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// httpClient is a fanoutv1.OrchestratorServiceClient that calls the HTTP
// listener at baseURL with the Connect protocol in JSON (connect-go, as a
// TypeScript or Python caller would speak it), with token as its bearer
// credential ("" for none): the tests that table every RPC run over HTTP
// through it unchanged. Errors come back as gRPC statuses, details kept.
func httpClient(t testing.TB, baseURL, token string) fanoutv1.OrchestratorServiceClient {
	t.Helper()
	if baseURL == "" {
		t.Fatal("the orchestrator serves no HTTP listener (--http-listen)")
	}
	return &connectClient{base: strings.TrimSuffix(baseURL, "/"), token: token, hc: http.DefaultClient}
}

type connectClient struct {
	base, token string
	hc          *http.Client
}

func (c *connectClient) url(method string) string { return c.base + method }

func (c *connectClient) auth(h http.Header) {
	if c.token != "" {
		h.Set("Authorization", "Bearer "+c.token)
	}
}

func unary[Req, Res any](ctx context.Context, c *connectClient, method string, req *Req) (*Res, error) {
	cl := connect.NewClient[Req, Res](c.hc, c.url(method), connect.WithProtoJSON())
	r := connect.NewRequest(req)
	c.auth(r.Header())
	res, err := cl.CallUnary(ctx, r)
	if err != nil {
		return nil, asStatus(err)
	}
	return res.Msg, nil
}

func serverStream[Req, Res any](ctx context.Context, c *connectClient, method string, req *Req) (grpc.ServerStreamingClient[Res], error) {
	cl := connect.NewClient[Req, Res](c.hc, c.url(method), connect.WithProtoJSON())
	r := connect.NewRequest(req)
	c.auth(r.Header())
	st, err := cl.CallServerStream(ctx, r)
	if err != nil {
		return nil, asStatus(err)
	}
	return &connectStream[Res]{ctx: ctx, st: st}, nil
}

// asStatus is a Connect error as the gRPC status it carries (same codes,
// same details).
func asStatus(err error) error {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return status.Error(codes.Unknown, err.Error())
	}
	sp := &spb.Status{Code: int32(ce.Code()), Message: ce.Message()} //nolint:gosec // codes fit
	for _, d := range ce.Details() {
		sp.Details = append(sp.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
	}
	return status.FromProto(sp).Err()
}

// connectStream is a Connect server stream as a gRPC client stream.
type connectStream[Res any] struct {
	grpc.ClientStream
	ctx context.Context
	st  *connect.ServerStreamForClient[Res]
}

func (s *connectStream[Res]) Recv() (*Res, error) {
	if s.st.Receive() {
		return s.st.Msg(), nil
	}
	if err := s.st.Err(); err != nil {
		return nil, asStatus(err)
	}
	_ = s.st.Close()
	return nil, io.EOF
}

func (s *connectStream[Res]) Context() context.Context { return s.ctx }
func (s *connectStream[Res]) Header() (metadata.MD, error) {
	return metadata.MD(s.st.ResponseHeader()), nil
}
func (s *connectStream[Res]) Trailer() metadata.MD { return metadata.MD(s.st.ResponseTrailer()) }
func (s *connectStream[Res]) CloseSend() error     { return nil }

func (c *connectClient) Run(ctx context.Context, in *fanoutv1.RunRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[fanoutv1.RunResponse], error) {
	return serverStream[fanoutv1.RunRequest, fanoutv1.RunResponse](ctx, c, fanoutv1.OrchestratorService_Run_FullMethodName, in)
}

func (c *connectClient) StartRun(ctx context.Context, in *fanoutv1.StartRunRequest, _ ...grpc.CallOption) (*fanoutv1.StartRunResponse, error) {
	return unary[fanoutv1.StartRunRequest, fanoutv1.StartRunResponse](ctx, c, fanoutv1.OrchestratorService_StartRun_FullMethodName, in)
}

func (c *connectClient) WatchRun(ctx context.Context, in *fanoutv1.WatchRunRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[fanoutv1.WatchRunResponse], error) {
	return serverStream[fanoutv1.WatchRunRequest, fanoutv1.WatchRunResponse](ctx, c, fanoutv1.OrchestratorService_WatchRun_FullMethodName, in)
}

func (c *connectClient) GetRun(ctx context.Context, in *fanoutv1.GetRunRequest, _ ...grpc.CallOption) (*fanoutv1.GetRunResponse, error) {
	return unary[fanoutv1.GetRunRequest, fanoutv1.GetRunResponse](ctx, c, fanoutv1.OrchestratorService_GetRun_FullMethodName, in)
}

func (c *connectClient) CancelRun(ctx context.Context, in *fanoutv1.CancelRunRequest, _ ...grpc.CallOption) (*fanoutv1.CancelRunResponse, error) {
	return unary[fanoutv1.CancelRunRequest, fanoutv1.CancelRunResponse](ctx, c, fanoutv1.OrchestratorService_CancelRun_FullMethodName, in)
}

func (c *connectClient) ListRuns(ctx context.Context, in *fanoutv1.ListRunsRequest, _ ...grpc.CallOption) (*fanoutv1.ListRunsResponse, error) {
	return unary[fanoutv1.ListRunsRequest, fanoutv1.ListRunsResponse](ctx, c, fanoutv1.OrchestratorService_ListRuns_FullMethodName, in)
}

func (c *connectClient) ListApprovals(ctx context.Context, in *fanoutv1.ListApprovalsRequest, _ ...grpc.CallOption) (*fanoutv1.ListApprovalsResponse, error) {
	return unary[fanoutv1.ListApprovalsRequest, fanoutv1.ListApprovalsResponse](ctx, c, fanoutv1.OrchestratorService_ListApprovals_FullMethodName, in)
}

func (c *connectClient) ApproveToolCall(ctx context.Context, in *fanoutv1.ApproveToolCallRequest, _ ...grpc.CallOption) (*fanoutv1.ApproveToolCallResponse, error) {
	return unary[fanoutv1.ApproveToolCallRequest, fanoutv1.ApproveToolCallResponse](ctx, c, fanoutv1.OrchestratorService_ApproveToolCall_FullMethodName, in)
}

func (c *connectClient) DenyToolCall(ctx context.Context, in *fanoutv1.DenyToolCallRequest, _ ...grpc.CallOption) (*fanoutv1.DenyToolCallResponse, error) {
	return unary[fanoutv1.DenyToolCallRequest, fanoutv1.DenyToolCallResponse](ctx, c, fanoutv1.OrchestratorService_DenyToolCall_FullMethodName, in)
}

func (c *connectClient) ListToolCalls(ctx context.Context, in *fanoutv1.ListToolCallsRequest, _ ...grpc.CallOption) (*fanoutv1.ListToolCallsResponse, error) {
	return unary[fanoutv1.ListToolCallsRequest, fanoutv1.ListToolCallsResponse](ctx, c, fanoutv1.OrchestratorService_ListToolCalls_FullMethodName, in)
}

func (c *connectClient) GetSpend(ctx context.Context, in *fanoutv1.GetSpendRequest, _ ...grpc.CallOption) (*fanoutv1.GetSpendResponse, error) {
	return unary[fanoutv1.GetSpendRequest, fanoutv1.GetSpendResponse](ctx, c, fanoutv1.OrchestratorService_GetSpend_FullMethodName, in)
}

func (c *connectClient) ListRunTasks(ctx context.Context, in *fanoutv1.ListRunTasksRequest, _ ...grpc.CallOption) (*fanoutv1.ListRunTasksResponse, error) {
	return unary[fanoutv1.ListRunTasksRequest, fanoutv1.ListRunTasksResponse](ctx, c, fanoutv1.OrchestratorService_ListRunTasks_FullMethodName, in)
}

func (c *connectClient) ListRunFacts(ctx context.Context, in *fanoutv1.ListRunFactsRequest, _ ...grpc.CallOption) (*fanoutv1.ListRunFactsResponse, error) {
	return unary[fanoutv1.ListRunFactsRequest, fanoutv1.ListRunFactsResponse](ctx, c, fanoutv1.OrchestratorService_ListRunFacts_FullMethodName, in)
}

func (c *connectClient) ContinueRun(ctx context.Context, in *fanoutv1.ContinueRunRequest, _ ...grpc.CallOption) (*fanoutv1.ContinueRunResponse, error) {
	return unary[fanoutv1.ContinueRunRequest, fanoutv1.ContinueRunResponse](ctx, c, fanoutv1.OrchestratorService_ContinueRun_FullMethodName, in)
}

func (c *connectClient) ForkRun(ctx context.Context, in *fanoutv1.ForkRunRequest, _ ...grpc.CallOption) (*fanoutv1.ForkRunResponse, error) {
	return unary[fanoutv1.ForkRunRequest, fanoutv1.ForkRunResponse](ctx, c, fanoutv1.OrchestratorService_ForkRun_FullMethodName, in)
}
