package node

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/netip"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/fanout/fanout/auth"
)

// CallerAuth is how an orchestrator authenticates its callers: the edge
// that faces the teams calling fanout, apart from the peer mTLS between
// orchestrators and workers. The zero value authenticates every call with
// an API key and serves it in plaintext (put TLS on it unless a proxy on
// the same host ends TLS).
type CallerAuth struct {
	// None serves every caller as an anonymous principal that may name any
	// tenant (--auth none): for `fanout dev` and tests on loopback. It is
	// logged loudly at start, and refused on an address beyond loopback
	// unless InsecureNoAuth is set too.
	None bool
	// InsecureNoAuth allows None on an address beyond loopback.
	InsecureNoAuth bool
	// TLS, when set, is the TLS of the caller-facing listener (its
	// certificate; client certificates are not asked for).
	TLS *tls.Config
}

// serverOptions returns the options of the caller-facing server: its
// transport credentials and the interceptors that put the caller's
// tenant.Principal in every call's context (keys: the authenticator's, whose
// revocation watcher the caller runs; none: an anonymous principal).
//
// With keys, the tap admits the calls read before authentication against
// the process's budget (callerTap), and the calls authenticated are held to
// their tenant's quota.
func (a CallerAuth) serverOptions(addr string, keys *auth.Authenticator, adm callerAdmission, log *slog.Logger) ([]grpc.ServerOption, error) {
	var opts []grpc.ServerOption
	if a.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(a.TLS)))
	}
	if !a.None {
		if a.TLS == nil && !IsLoopback(addr) {
			log.Warn("callers' API keys travel in plaintext: give the caller-facing listener TLS (--tls-cert, --tls-key) "+
				"unless a proxy on this host ends TLS", "listen", addr)
		}
		opts = append(opts, grpc.InTapHandle(callerTap(keys, adm)))
		opts = append(opts, keys.ServerOptions()...)
		return append(opts, adm.tenants.afterAuth()...), nil
	}
	if !IsLoopback(addr) && !a.InsecureNoAuth {
		return nil, fmt.Errorf("orchestrator: refusing to serve %s without authentication: "+
			"--auth none is for loopback; give callers API keys, or pass --insecure-no-auth", addr)
	}
	log.Warn("AUTHENTICATION IS OFF (--auth none): every caller may act as any tenant, manage tenants and keys; "+
		"use it on loopback only", "listen", addr)
	return append(opts, auth.NoneServerOptions()...), nil
}

// IsLoopback reports whether addr (HOST:PORT, as listened on or dialled)
// is only reachable from this host: a loopback IP or localhost. An empty
// host (":50051") listens on every interface.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// callerAdmission is what holds the caller-facing server's calls to the
// process's budgets: before authentication (unverified keys, open methods)
// and after (each tenant's quota).
type callerAdmission struct {
	// unverified: the lookups of keys not in the cache; known: those of
	// keys whose ids are live keys' (auth.TapKnown), a lane a flood of
	// made-up ids cannot fill; open: health and reflection.
	unverified, known, open *preauth
	tenants                 *tenantLimit
	// bytes is the process's request-bytes budget, which both listeners
	// take from.
	bytes *requestBytes
}

// admission returns the budgets of a caller-facing server whose receive
// limit is recvLimit bytes, or an error naming the flag when the
// request-bytes budget cannot admit a request at that limit.
func (b *Backend) admission(recvLimit int) (callerAdmission, error) {
	if err := checkRequestBytes(b.reqBytes.total, b.reqBytes.perTenant, recvLimit); err != nil {
		return callerAdmission{}, err
	}
	return callerAdmission{
		unverified: newPreauth(b.unauthBytes, recvLimit, b.unauthWait, "unauthenticated"),
		known:      newPreauth(b.unauthBytes, recvLimit, b.unauthWait, "known-key"),
		open:       newPreauth(b.unauthBytes, recvLimit, b.unauthWait, "health or reflection"),
		tenants:    b.tenants,
		bytes:      newRequestBytes(b.reqBytes.total, b.reqBytes.perTenant, b.reqBytes.wait),
	}, nil
}
