package node

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/vanguard"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/fanout/fanout/auth"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// HTTPConfig configures an orchestrator's HTTP listener: the same API as
// its gRPC listener (OrchestratorService and AdminService, never
// SubagentService) in the Connect protocol (JSON or binary, HTTP/1.1 and
// HTTP/2, server streaming for Run and WatchRun), gRPC-Web, and REST paths
// from the protos' google.api.http annotations, with the same
// authentication, scopes, tenant rules and limits; and, if set, the web
// console.
type HTTPConfig struct {
	// Listen is the address (HOST:PORT) to serve HTTP on; empty: off.
	Listen string
	// Console, when set, is served at /console/ (and / redirects there).
	Console http.Handler
	// InsecurePlaintext allows plaintext HTTP on an address beyond loopback
	// (--http-insecure: a proxy in the same pod or host ends TLS). Without
	// it such an address needs the caller-facing TLS (CallerAuth.TLS).
	InsecurePlaintext bool
}

// The HTTP listener's bounds. ReadHeaderTimeout and MaxHeaderBytes hold a
// connection that never finishes its headers; IdleTimeout closes a kept-
// alive connection with no request; the HTTP/2 pings drop a peer that
// vanished, as the gRPC keepalive does. There is no whole-request timeout:
// WatchRun streams for as long as the run lasts. A request's body is bounded
// by httpBodyLimit, and one read before its key is verified by the
// --unauthenticated-read-timeout, as on gRPC.
const (
	httpReadHeaderTimeout = 10 * time.Second
	httpIdleTimeout       = 2 * time.Minute
	// httpMaxGetURLBytes bounds a Connect GET's URL (its message).
	httpMaxGetURLBytes = 16 << 10
)

// httpLimits are the timeouts of an HTTP listener: the constants above,
// which only tests shorten (SetHTTPTimeouts).
type httpLimits struct {
	readHeader, idle time.Duration
}

var defaultHTTPLimits = httpLimits{readHeader: httpReadHeaderTimeout, idle: httpIdleTimeout}

// httpBodyLimit is the most bytes a request's body may have on a listener
// whose gRPC receive limit is recvLimit: JSON takes more bytes than the
// binary encoding (field names, escapes, base64), twice is ample; more is
// refused before it is read whole.
func httpBodyLimit(recvLimit int) int64 { return 2*int64(recvLimit) + 64 }

// contentSecurityPolicy is every HTTP response's: the console's script,
// style and API calls come from its own origin, nothing inline, no frames.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// httpServer is an orchestrator's HTTP listener.
type httpServer struct {
	srv    *http.Server
	lis    net.Listener
	tls    bool
	served chan struct{}
}

// listenHTTP opens the HTTP listener cfg describes in front of grpcSrv (the
// caller-facing gRPC server, whose interceptors authenticate and limit
// every call): keys, when not nil, authenticates callers before their
// bodies are read, against adm, as the gRPC tap does.
func listenHTTP(cfg HTTPConfig, ca CallerAuth, grpcSrv *grpc.Server, keys *auth.Authenticator, adm callerAdmission,
	recvLimit int, readTimeout time.Duration, limits httpLimits, log *slog.Logger) (*httpServer, error) {
	if ca.TLS == nil && !IsLoopback(cfg.Listen) && !cfg.InsecurePlaintext {
		return nil, fmt.Errorf("orchestrator: refusing to serve HTTP on %s in plaintext: give it TLS (--tls-cert, --tls-key), "+
			"listen on loopback, or pass --http-insecure when a proxy on this host ends TLS", cfg.Listen)
	}
	if ca.None && !IsLoopback(cfg.Listen) && !ca.InsecureNoAuth {
		return nil, fmt.Errorf("orchestrator: refusing to serve HTTP on %s without authentication: "+
			"--auth none is for loopback; give callers API keys, or pass --insecure-no-auth", cfg.Listen)
	}
	api, err := transcoder(grpcSrv, recvLimit)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	routes := newHTTPRoutes(fanoutv1.File_fanout_v1_orchestrator_proto.Services().Get(0), fanoutv1.File_fanout_v1_admin_proto.Services().Get(0))
	mux.Handle("/", &httpAdmission{next: api, keys: keys, adm: adm, routes: routes, bodyLimit: httpBodyLimit(recvLimit),
		readTimeout: readTimeout})
	if cfg.Console != nil {
		mux.Handle("/console/", cfg.Console)
		mux.Handle("GET /{$}", http.RedirectHandler("/console/", http.StatusFound))
	}
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("orchestrator: HTTP: listen on %s: %w", cfg.Listen, err)
	}
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetHTTP2(true)
	if ca.TLS == nil {
		protocols.SetUnencryptedHTTP2(true) // h2c prior knowledge: gRPC-Web and Connect clients on loopback
	}
	front := &httpFront{next: mux, loopback: IsLoopback(cfg.Listen), behindProxy: cfg.InsecurePlaintext}
	srv := &http.Server{
		Handler:           securityHeaders(front, ca.TLS != nil),
		ReadHeaderTimeout: limits.readHeader,
		IdleTimeout:       limits.idle,
		MaxHeaderBytes:    maxHTTPHeaderBytes,
		Protocols:         &protocols,
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: StreamsPerConn,
			// What the transport holds of bodies not read yet, as on gRPC
			// (callerWindow).
			MaxReceiveBufferPerStream: callerWindow, MaxReceiveBufferPerConnection: callerConnWindow,
			SendPingTimeout: keepaliveTime, PingTimeout: keepaliveTimeout},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	if ca.TLS != nil {
		srv.TLSConfig = ca.TLS.Clone()
	}
	return &httpServer{srv: srv, lis: lis, tls: ca.TLS != nil, served: make(chan struct{})}, nil
}

// maxHTTPHeaderBytes bounds a request's headers as the gRPC listener's
// (orchestrator.MaxHeaderBytes, 64 KiB).
const maxHTTPHeaderBytes = 64 << 10

// transcoder is the HTTP face of grpcSrv's OrchestratorService and
// AdminService (and of nothing else it serves): vanguard turns Connect,
// gRPC-Web and REST calls into gRPC calls of grpcSrv.ServeHTTP, so every
// interceptor (authentication, scopes, --max-streams, tenant quotas) and
// the receive limit apply as on the gRPC listener.
func transcoder(grpcSrv *grpc.Server, recvLimit int) (http.Handler, error) {
	opts := []vanguard.ServiceOption{
		vanguard.WithTargetProtocols(vanguard.ProtocolGRPC),
		vanguard.WithTargetCodecs(vanguard.CodecProto),
		vanguard.WithNoTargetCompression(),                                               // vanguard inflates (bounded below); the gRPC server has no decompressor
		vanguard.WithMaxMessageBufferBytes(uint32(min(httpBodyLimit(recvLimit), 1<<31))), //nolint:gosec // clamped
		vanguard.WithMaxGetURLBytes(httpMaxGetURLBytes),
	}
	services := []*vanguard.Service{
		vanguard.NewService(fanoutv1.OrchestratorService_ServiceDesc.ServiceName, grpcSrv, opts...),
		vanguard.NewService(fanoutv1.AdminService_ServiceDesc.ServiceName, grpcSrv, opts...),
	}
	t, err := vanguard.NewTranscoder(services, vanguard.WithUnknownHandler(http.HandlerFunc(notFound)),
		// gzip inflated no further than the body limit (vanguard's own
		// inflates whole, then checks the size).
		vanguard.WithCompression(vanguard.CompressionGzip, func() connect.Compressor { return gzip.NewWriter(io.Discard) },
			boundedGzip(httpBodyLimit(recvLimit))))
	if err != nil {
		return nil, fmt.Errorf("orchestrator: HTTP transcoder: %w", err)
	}
	return t, nil
}

func notFound(w http.ResponseWriter, r *http.Request) {
	writeStatus(w, r, status.Newf(codes.NotFound, "%s %s: no such method or path", r.Method, r.URL.Path))
}

// httpAdmission is the HTTP listener's tap and gate: what the gRPC
// listener's tap (callerTap) and gate do before a body is read. A query
// parameter naming a field the REST path binds is refused. With API keys, a
// request without a credential, or with a key this process knows to be bad,
// is refused UNAUTHENTICATED; one whose key is not verified yet has it
// looked up now, holding a share of the unauthenticated budget for the
// lookup only, so an unknown key's body is never read; a verified key that
// lacks the RPC's scope is refused PERMISSION_DENIED, else it takes a slot
// of its tenant's quota. Then the request takes its charge of the
// request-bytes budget — its announced size, or the body limit when it is
// not announced or compressed, times the copies a request makes (httpCharge)
// — held until the handler returns, and its body is bounded.
type httpAdmission struct {
	next      http.Handler
	keys      *auth.Authenticator // nil: --auth none
	adm       callerAdmission
	routes    *httpRoutes
	bodyLimit int64
	// readTimeout bounds the read of the body (--request-read-timeout).
	readTimeout time.Duration
}

// httpFront refuses, for the API and the console alike, a request for
// another host than a loopback listener's (a DNS-rebinding page reaching
// `fanout dev`, whose authentication is off) and a cross-origin browser
// request (no CORS).
type httpFront struct {
	next http.Handler
	// loopback: the listener is on loopback, so only loopback host names
	// may address it; behindProxy: a proxy on this host ends TLS
	// (--http-insecure), so a browser's origin may be https.
	loopback, behindProxy bool
}

func (f *httpFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.loopback && !loopbackHost(r.Host) {
		writeStatus(w, r, status.Newf(codes.PermissionDenied,
			"host %q: this listener is on loopback and answers only localhost or a loopback address (DNS rebinding)", r.Host))
		return
	}
	if origin := r.Header.Get("Origin"); origin != "" && !sameOrigin(origin, r, f.behindProxy) {
		writeStatus(w, r, status.Newf(codes.PermissionDenied,
			"cross-origin requests are not served (no CORS): call from the server's own origin or from a backend"))
		return
	}
	f.next.ServeHTTP(w, r)
}

func (h *httpAdmission) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if st := pathBoundQuery(r); st != nil {
		writeStatus(w, r, st)
		return
	}
	ctx, method := r.Context(), h.routes.method(r)
	who := anonymous
	if h.keys != nil {
		vals := r.Header.Values("Authorization")
		class, p := h.keys.TapCredential(vals)
		if class == auth.TapUnverified || class == auth.TapKnown {
			// Look the key up before any byte of the body is read.
			lookup, err := h.adm.lookup(ctx, class, auth.Credential(vals))
			if err != nil {
				writeStatus(w, r, status.Convert(err))
				return
			}
			_, err = h.keys.Authenticate(lookup, strings.TrimSpace(strings.TrimPrefix(vals[0], "Bearer ")))
			releaseAdmission(lookup)
			if err != nil {
				writeStatus(w, r, status.Convert(err))
				return
			}
			class, p = h.keys.TapCredential(vals)
		}
		admitted, err := h.adm.admit(ctx, method, class, p, "")
		if err != nil {
			writeStatus(w, r, status.Convert(err))
			return
		}
		ctx, who = admitted, subject(p, true)
	}
	if r.ContentLength > h.bodyLimit {
		writeStatus(w, r, status.Newf(codes.ResourceExhausted,
			"request body is %d bytes; this listener reads at most %d (twice the receive limit)", r.ContentLength, h.bodyLimit))
		return
	}
	size, exact := h.bodyLimit, r.ContentLength >= 0 && !compressed(r)
	if exact {
		size = r.ContentLength
	}
	c, err := h.adm.bytes.acquire(ctx, who, httpCharge(size+int64(len(r.URL.RawQuery))))
	if err != nil {
		writeStatus(w, r, status.Convert(err))
		return
	}
	defer c.release()
	if a, ok := ctx.Value(admissionKey{}).(*admission); ok {
		a.httpCharged = true
	} else {
		ctx = context.WithValue(ctx, admissionKey{}, &admission{httpCharged: true})
	}
	// A body of no announced length is cut as it is read: vanguard's buffer
	// limit (httpBodyLimit) refuses it RESOURCE_EXHAUSTED naming the limit;
	// this reader, a little above it, is the backstop for what vanguard
	// does not buffer. Read to its end, a body not compressed shrinks its
	// charge to what it was.
	body := &chargedBody{ReadCloser: http.MaxBytesReader(w, r.Body, h.bodyLimit+bodySlack), c: c, exact: !compressed(r),
		extra: int64(len(r.URL.RawQuery))}
	r.Body = body
	// The body is read within the request read timeout, or the call ends
	// (a caller stalling it does not hold its charge for longer).
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(h.readTimeout))
	body.eof = func() { _ = rc.SetReadDeadline(time.Time{}) }
	h.next.ServeHTTP(w, r.WithContext(ctx))
}

// chargedBody counts what is read of a body and, at its end, shrinks the
// request's charge to it when the body is not compressed.
type chargedBody struct {
	io.ReadCloser
	c        *charge
	exact    bool
	n, extra int64
	eof      func() // called at the body's end
}

func (b *chargedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	if errors.Is(err, io.EOF) {
		if b.exact {
			b.c.shrink(httpCharge(b.n + b.extra))
		}
		if b.eof != nil {
			b.eof()
		}
	}
	return n, err
}

// bodySlack is how far past the body limit the backstop reader lets a
// body go: an envelope's framing, so that vanguard's clearer refusal comes
// first.
const bodySlack = 64 << 10

// loopbackHost reports whether a request's Host names this host: localhost
// or a loopback address, with or without a port.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// sameOrigin reports whether a browser's Origin header names the origin r
// was sent to: the same host, and the scheme of the listener (https also
// when a proxy on this host ends TLS).
func sameOrigin(origin string, r *http.Request, behindProxy bool) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host != r.Host {
		return false
	}
	switch {
	case r.TLS != nil:
		return u.Scheme == "https"
	case behindProxy:
		return u.Scheme == "https" || u.Scheme == "http"
	}
	return u.Scheme == "http"
}

// pathBound are the REST paths that bind a request field, and the field's
// names as a query parameter: vanguard would let the query override the
// path, so that GET /v1/runs/A/tool-calls?runId=B read B (the tenant rule
// still held, but a proxy's path-based rules or logs would be misled).
var pathBound = []struct {
	prefix string
	names  []string
}{
	{"/v1/runs/", []string{"runId", "run_id"}},
	{"/v1/approvals/", []string{"callId", "call_id"}},
	{"/v1/admin/tenants/", []string{"tenantId", "tenant_id"}},
	{"/v1/admin/keys/", []string{"keyId", "key_id"}},
}

// pathBoundQuery is the INVALID_ARGUMENT status of a REST request whose
// query names a field its path binds; nil otherwise.
func pathBoundQuery(r *http.Request) *status.Status {
	if r.URL.RawQuery == "" {
		return nil
	}
	q := r.URL.Query()
	for _, b := range pathBound {
		rest, ok := strings.CutPrefix(r.URL.Path, b.prefix)
		if !ok || rest == "" {
			continue
		}
		for _, name := range b.names {
			if q.Has(name) {
				return status.Newf(codes.InvalidArgument, "query parameter %s: the path %s names it already", name, r.URL.Path)
			}
		}
	}
	return nil
}

// securityHeaders sets every response's security headers: the
// Content-Security-Policy, no sniffing, no framing, no referrer, and no
// caching of API answers (the console's assets set their own).
func securityHeaders(next http.Handler, tls bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		if tls {
			h.Set("Strict-Transport-Security", "max-age=31536000")
		}
		next.ServeHTTP(w, r)
	})
}

// writeStatus answers r, whose body was not read, with st in the protocol r
// speaks: a REST path google.rpc.Status JSON under the HTTP status of its
// code (as vanguard answers the service's own errors); any other what
// connect's error writer writes (gRPC-Web trailers-only, a Connect unary
// error as JSON under the HTTP status of its code, the status's details
// kept), but a Connect stream is answered as a Connect unary call is (see
// refusedStream).
func writeStatus(w http.ResponseWriter, r *http.Request, st *status.Status) {
	if r.ProtoMajor == 1 && r.ContentLength != 0 {
		// The body was not read and will not be kept: close the connection
		// after the answer, and drain what the caller still sends meanwhile.
		w.Header().Set("Connection", "close")
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		defer drain(rc, r.Body)
	}
	if strings.HasPrefix(r.URL.Path, "/v1/") && r.Header.Get("Connect-Protocol-Version") == "" {
		body, err := protojson.Marshal(st.Proto())
		if err != nil {
			body = []byte(`{"code":13,"message":"internal error"}`)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(httpStatus(st.Code()))
		_, _ = w.Write(body)
		return
	}
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/connect+") {
		r = refusedStream
	}
	_ = connectErrors.Write(w, r, connectError(st))
}

// connectErrors writes an error in the protocol of the request: Connect
// (unary or streaming), gRPC or gRPC-Web.
var connectErrors = connect.NewErrorWriter()

// refusedStream stands for a Connect streaming request refused before its
// body was read, so that connectErrors answers it as it answers a request
// of no RPC protocol: the Connect unary error, its code in the HTTP status,
// which a Connect client maps back to the code (the protocol's rule for an
// answer that is not 200). The streaming form (200, the error in the
// end-of-stream message in the body) has the caller read the body of an
// answer that came before it had sent its request, and connect-go's client
// can lose that body: it drops the request's bytes as soon as the answer's
// headers come, so its transport, if it had not written them yet, sends a
// short body and closes the connection under the answer, and the call ends
// INTERNAL ("I/O error after end-stream message") — on a loaded machine
// about one call in a hundred (TestConnectStreamRefusalIsInTheStatus).
var refusedStream = &http.Request{Method: http.MethodPost, Header: http.Header{}}

// connectError is st as a Connect error, with its details.
func connectError(st *status.Status) *connect.Error {
	ce := connect.NewError(connect.Code(st.Code()), errors.New(st.Message()))
	for _, d := range st.Proto().GetDetails() {
		m, err := d.UnmarshalNew()
		if err != nil {
			continue
		}
		if ed, err := connect.NewErrorDetail(m); err == nil {
			ce.AddDetail(ed)
		}
	}
	return ce
}

// drain reads and drops what is left of a refused HTTP/1 body, keeping
// none of it, for at most lingerTime and lingerBytes, once the answer is
// sent. Closing at once would leave bytes unread, and the kernel answers
// those with a reset: a caller that sends its whole body before it reads
// (Python's requests, curl without Expect) would see "broken pipe", not
// why it was refused. HTTP/2 ends the stream instead, and needs nothing.
func drain(rc *http.ResponseController, body io.Reader) {
	if rc.Flush() != nil || rc.SetReadDeadline(time.Now().Add(lingerTime)) != nil {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(body, lingerBytes))
}

// lingerTime and lingerBytes bound what drain reads of a refused body
// (docs/http.md "Limits"): past them the connection closes, and a caller
// still sending sees it reset.
const (
	lingerTime  = 10 * time.Second
	lingerBytes = 64 << 20
)

// httpStatus is the HTTP status the Connect protocol gives code, which a
// REST answer takes too.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.Canceled:
		return 499
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	}
	return http.StatusInternalServerError
}

// addr is the address the HTTP listener listens on.
func (h *httpServer) addr() string { return h.lis.Addr().String() }

// serve serves in a goroutine; a failure goes to exited.
func (h *httpServer) serve(exited chan<- error) {
	go func() {
		defer close(h.served)
		var err error
		if h.tls {
			err = h.srv.ServeTLS(h.lis, "", "")
		} else {
			err = h.srv.Serve(h.lis)
		}
		if !errors.Is(err, http.ErrServerClosed) {
			select {
			case exited <- fmt.Errorf("HTTP: %w", err):
			default:
			}
		}
	}()
}

// stop stops accepting, waits for the calls in flight until ctx ends, then
// closes what is left.
func (h *httpServer) stop(ctx context.Context) {
	if err := h.srv.Shutdown(ctx); err != nil {
		_ = h.srv.Close()
	}
	<-h.served
}
