package node

import (
	"context"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/fanout/fanout/auth"
	"github.com/fanout/fanout/tenant"
)

// gate holds the caller-facing gRPC services' calls to the request-bytes
// budget. gRPC reads a call's request when its handler asks for it — a
// unary call's before any interceptor runs, a stream's when the handler
// calls RecvMsg — so the gate wraps each handler (gatedService): before the
// request is read it takes the call's charge, at the receive limit since
// its size is not known yet, and shrinks it to the decoded message's once
// it is read. A unary call whose key is not verified yet has it looked up
// first (an unknown key's request is never read, as on HTTP). A call from
// the HTTP listener was charged there and passes.
type gate struct {
	bytes     *requestBytes
	keys      *auth.Authenticator // nil: --auth none
	recvLimit int
	// readTimeout bounds the read of a request once it has its charge
	// (--request-read-timeout): a caller stalling its body does not hold
	// its share of the budget for longer.
	readTimeout time.Duration
}

// service is desc with every handler behind the gate.
func (g *gate) service(desc *grpc.ServiceDesc) *grpc.ServiceDesc {
	d := *desc
	d.Methods = make([]grpc.MethodDesc, len(desc.Methods))
	for i, m := range desc.Methods {
		method, h := "/"+desc.ServiceName+"/"+m.MethodName, m.Handler
		d.Methods[i] = grpc.MethodDesc{MethodName: m.MethodName,
			Handler: func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
				c, err := g.unary(ctx, method)
				if err != nil {
					return nil, err
				}
				defer c.release()
				return h(srv, ctx, func(v any) error {
					err := readWithin(ctx, g.readTimeout, func() error { return dec(v) })
					if m, ok := v.(proto.Message); ok && err == nil {
						c.shrink(grpcCharge(int64(proto.Size(m))))
					}
					return err
				}, in)
			}}
	}
	d.Streams = make([]grpc.StreamDesc, len(desc.Streams))
	for i, s := range desc.Streams {
		h := s.Handler
		s.Handler = func(srv any, ss grpc.ServerStream) error {
			c, err := g.stream(ss.Context())
			if err != nil {
				return err
			}
			defer c.release()
			return h(srv, &gatedStream{ServerStream: ss, c: c, readTimeout: g.readTimeout})
		}
		d.Streams[i] = s
	}
	return &d
}

// unary admits a unary call of method before its request is read: its key
// verified (looked up now if the tap could not), its scope checked, its
// charge taken from its tenant's share.
func (g *gate) unary(ctx context.Context, method string) (*charge, error) {
	a, _ := ctx.Value(admissionKey{}).(*admission)
	switch {
	case a != nil && a.httpCharged:
		return noCharge, nil
	case g.keys == nil:
		return g.bytes.acquire(ctx, anonymous, grpcCharge(int64(g.recvLimit)))
	case a == nil:
		// An open method (health, reflection) is not gated: no admission
		// means the tap did not run, which a served server never skips.
		return noCharge, nil
	}
	who := a.who
	if !a.verified {
		md, _ := metadata.FromIncomingContext(ctx)
		vals := md.Get("authorization")
		if len(vals) != 1 {
			return nil, auth.ErrNoCredential()
		}
		p, err := g.keys.Authenticate(ctx, strings.TrimSpace(strings.TrimPrefix(vals[0], "Bearer ")))
		if err != nil {
			return nil, err
		}
		who = p
		releaseAdmission(ctx) // its share of the unauthenticated budget covered the lookup only
	}
	if err := scopeDenied(method, who); err != nil {
		return nil, err
	}
	return g.bytes.acquire(ctx, subject(who, true), grpcCharge(int64(g.recvLimit)))
}

// stream admits a stream before its first message is read. Its
// interceptors have run: the principal is in ctx.
func (g *gate) stream(ctx context.Context) (*charge, error) {
	if a, _ := ctx.Value(admissionKey{}).(*admission); a != nil && a.httpCharged {
		return noCharge, nil
	}
	who := anonymous
	if g.keys != nil {
		who = subject(tenant.FromContext(ctx))
	}
	return g.bytes.acquire(ctx, who, grpcCharge(int64(g.recvLimit)))
}

// anonymous is the subject of every caller of --auth none.
const anonymous = "anonymous"

// gatedStream shrinks its charge to each message it receives. (The API has
// no client streams: a stream's one request is its first message.)
type gatedStream struct {
	grpc.ServerStream
	c           *charge
	readTimeout time.Duration
}

func (s *gatedStream) RecvMsg(m any) error {
	err := readWithin(s.Context(), s.readTimeout, func() error { return s.ServerStream.RecvMsg(m) })
	if pm, ok := m.(proto.Message); ok && err == nil {
		s.c.shrink(grpcCharge(int64(proto.Size(pm))))
	}
	return err
}
