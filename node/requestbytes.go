package node

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The defaults of the request-bytes budget (docs/operations.md "Memory"):
// 320 MiB in all, 80 MiB for one tenant, so that it takes four tenants'
// whole shares to fill the process. One tenant's share admits one request
// at the HTTP body limit (httpCharge of 16 MiB: 64 MiB) or four at the gRPC
// receive limit (grpcCharge of 8 MiB: 16 MiB) at once.
const (
	DefaultRequestBytes       = 320 << 20
	DefaultTenantRequestBytes = 80 << 20
	// DefaultRequestBytesWait is how long a request waits for its share of
	// the budget before it is refused RESOURCE_EXHAUSTED.
	DefaultRequestBytesWait = 5 * time.Second
	// DefaultRequestReadTimeout is how long a request holding its charge
	// may take to be sent: 8 MiB (the receive limit) at 300 KB/s.
	DefaultRequestReadTimeout = 30 * time.Second
)

// The charge of a request is its size times the copies of it a process
// holds while it is read and decoded (measured: docs/operations.md
// "Memory"): over gRPC, the bytes read and the decoded message; over HTTP,
// the body, the message vanguard decodes from it, the gRPC request it
// encodes again, and what the gRPC server reads and decodes of that.
const (
	grpcCopies = 2
	httpCopies = 4
)

// callerWindow is the HTTP/2 flow-control window of a call on the
// caller-facing listeners, fixed (gRPC's bandwidth estimation would grow it
// to 16 MiB): what the transport may hold of a request's body before the
// request has its charge (a call waiting its turn, or its key's lookup) is
// at most this per call. The connection's window is larger, so that calls
// on one connection do not wait on each other.
const (
	callerWindow     = 64 << 10
	callerConnWindow = 1 << 20
)

// callerWindows are the caller-facing gRPC server's windows.
func callerWindows() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.InitialWindowSize(callerWindow), grpc.InitialConnWindowSize(callerConnWindow)}
}

// requestBytes is the budget of request bytes one process holds in memory,
// read or being read, decoded or being decoded: a total for the process and
// a share for each subject (a tenant, an admin key, the anonymous callers of
// --auth none). A request takes its charge before any byte of its body is
// read, at the most its body may be when its size is not known yet, waiting
// for it in turn (FIFO) up to wait, and keeps it until its message is
// released: when a unary call returns, when a stream ends. Once the
// message is decoded the charge shrinks to what it is. The gRPC listener
// (gatedService) and the HTTP listener (httpAdmission) take from the same
// value, so no caller holds more than its share whichever door it uses.
type requestBytes struct {
	total      *semaphore.Weighted
	totalMax   int64
	subjectMax int64
	wait       time.Duration

	mu       sync.Mutex
	subjects map[string]*subjectBytes
}

type subjectBytes struct {
	sem  *semaphore.Weighted
	refs int
}

func newRequestBytes(total, perSubject int64, wait time.Duration) *requestBytes {
	return &requestBytes{total: semaphore.NewWeighted(total), totalMax: total, subjectMax: perSubject, wait: wait,
		subjects: map[string]*subjectBytes{}}
}

// charge is what one request holds of a requestBytes budget.
type charge struct {
	rb  *requestBytes
	who string
	sub *subjectBytes

	mu   sync.Mutex
	n    int64 // held; 0 once released
	done bool
}

// noCharge is the charge of a request charged elsewhere (an HTTP request,
// charged at the HTTP door, reaching the gRPC server through vanguard).
var noCharge = &charge{done: true}

// acquire takes n bytes of who's share and of the total, waiting in turn
// until they are free, rb.wait passes or ctx ends. A charge larger than a
// share can never be taken: newRequestBytes's callers size the shares for
// the largest request (checkRequestBytes).
func (rb *requestBytes) acquire(ctx context.Context, who string, n int64) (*charge, error) {
	if n > rb.subjectMax || n > rb.totalMax {
		return nil, rb.refusal(who, n, false)
	}
	rb.mu.Lock()
	sub := rb.subjects[who]
	if sub == nil {
		sub = &subjectBytes{sem: semaphore.NewWeighted(rb.subjectMax)}
		rb.subjects[who] = sub
	}
	sub.refs++
	rb.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, rb.wait)
	defer cancel()
	if err := sub.sem.Acquire(wctx, n); err != nil {
		rb.unref(who, sub)
		return nil, rb.waitErr(ctx, who, n, true)
	}
	if err := rb.total.Acquire(wctx, n); err != nil {
		sub.sem.Release(n)
		rb.unref(who, sub)
		return nil, rb.waitErr(ctx, who, n, false)
	}
	return &charge{rb: rb, who: who, sub: sub, n: n}, nil
}

func (rb *requestBytes) unref(who string, sub *subjectBytes) {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if sub.refs--; sub.refs == 0 {
		delete(rb.subjects, who)
	}
}

// waitErr is the status of a request that did not get its charge: the
// call's own end if ctx ended, else RESOURCE_EXHAUSTED naming the budget.
func (rb *requestBytes) waitErr(ctx context.Context, who string, n int64, share bool) error {
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	return rb.refusal(who, n, share)
}

func (rb *requestBytes) refusal(who string, n int64, share bool) error {
	subject, flag, limit := who, "--tenant-request-bytes", rb.subjectMax
	if !share {
		subject, flag, limit = "this process", "--request-bytes", rb.totalMax
	}
	msg := fmt.Sprintf("%s holds at most %d bytes of requests in memory on this process (%s); "+
		"this request needs %d until it is decoded: retry later", subject, limit, flag, n)
	st, err := status.New(codes.ResourceExhausted, msg).WithDetails(
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: subject,
			Description: fmt.Sprintf("at most %d bytes of requests in memory (%s)", limit, flag)}}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
	if err != nil {
		return status.Error(codes.ResourceExhausted, msg)
	}
	return st.Err()
}

// shrink gives back what c holds above n: the request's message is
// decoded, and n is what it holds now.
func (c *charge) shrink(n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done || n >= c.n {
		return
	}
	give := c.n - max(n, 0)
	c.n -= give
	c.rb.total.Release(give)
	c.sub.sem.Release(give)
}

// release gives back all c holds, once.
func (c *charge) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return
	}
	c.done = true
	c.rb.total.Release(c.n)
	c.sub.sem.Release(c.n)
	c.rb.unref(c.who, c.sub)
	c.n = 0
}

// checkRequestBytes refuses budgets that cannot admit the largest request
// a listener with receive limit recvLimit may read (an HTTP body at its
// limit), with a message naming the flag.
func checkRequestBytes(total, perSubject int64, recvLimit int) error {
	need := httpCharge(httpBodyLimit(recvLimit))
	switch {
	case perSubject < need:
		return fmt.Errorf("--tenant-request-bytes is %d: it must be at least %d, the charge of one HTTP request at the body limit "+
			"(%d copies of %d bytes)", perSubject, need, httpCopies, httpBodyLimit(recvLimit))
	case total < perSubject:
		return fmt.Errorf("--request-bytes is %d: it must be at least --tenant-request-bytes (%d)", total, perSubject)
	}
	return nil
}

func grpcCharge(size int64) int64 { return grpcCopies * size }
func httpCharge(size int64) int64 { return httpCopies * size }
