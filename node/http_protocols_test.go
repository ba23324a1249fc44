package node_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/fanout/fanout/node"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store/storetest"
)

// selfSigned is a certificate for 127.0.0.1 and the pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fanout test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}, pool
}

// call sends one request with client and returns its status, protocol and body.
func call(ctx context.Context, t *testing.T, client *http.Client, method, url, token, ct, body string, header ...string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Proto, string(out) + resp.Header.Get("Grpc-Status") + resp.Trailer.Get("Grpc-Status")
}

// TestHTTPProtocols: the HTTP listener speaks REST, Connect and gRPC-Web
// over HTTP/1.1, HTTP/2 in plaintext on loopback (h2c), and HTTP/2 over TLS
// with the caller-facing certificate, whose answers carry HSTS.
func TestHTTPProtocols(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b, _, base := openHTTP(t, node.BackendConfig{}, nil)
	token := newTenantKey(t, b, "acme")
	var h2c http.Protocols
	h2c.SetUnencryptedHTTP2(true)
	clients := map[string]*http.Client{
		"HTTP/1.1": {Transport: &http.Transport{}},
		"HTTP/2.0": {Transport: &http.Transport{Protocols: &h2c}},
	}
	for want, client := range clients {
		if code, proto, out := call(ctx, t, client, "GET", base+"/v1/runs", token, "", ""); code != 200 || proto != want {
			t.Errorf("REST GET /v1/runs over %s: %d %s %.200s", want, code, proto, out)
		}
		if code, proto, out := call(ctx, t, client, "POST", base+"/fanout.v1.OrchestratorService/ListRuns", token,
			"application/json", "{}", "Connect-Protocol-Version", "1"); code != 200 || proto != want || !strings.HasPrefix(out, "{") {
			t.Errorf("Connect ListRuns over %s: %d %s %.200s", want, code, proto, out)
		}
		// gRPC-Web: an empty ListRunsRequest, enveloped; the status in the trailers.
		if code, proto, out := call(ctx, t, client, "POST", base+"/fanout.v1.OrchestratorService/ListRuns", token,
			"application/grpc-web+proto", "\x00\x00\x00\x00\x00"); code != 200 || proto != want || !strings.Contains(strings.ToLower(out), "grpc-status: 0") {
			t.Errorf("gRPC-Web ListRuns over %s: %d %s %q; want grpc-status:0", want, code, proto, out)
		}
	}

	// TLS: the same certificate as the gRPC listener, HTTP/2 by ALPN, HSTS.
	cert, pool := selfSigned(t)
	tb := backend(t, storetest.NewDB(t), node.BackendConfig{})
	tlsToken := newTenantKey(t, tb, "acme")
	o := startOrchestrator(t, tb, node.OrchestratorConfig{Workers: "127.0.0.1:1", HTTP: node.HTTPConfig{Listen: "127.0.0.1:0"},
		Auth: node.CallerAuth{TLS: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}})
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2: true}}
	req, _ := http.NewRequestWithContext(ctx, "GET", "https://"+o.HTTPAddr()+"/v1/runs", nil)
	req.Header.Set("Authorization", "Bearer "+tlsToken)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != 200 || resp.Proto != "HTTP/2.0" || !strings.Contains(resp.Header.Get("Strict-Transport-Security"), "max-age") {
		t.Errorf("REST over TLS: %d %s, HSTS %q; want 200 over HTTP/2 with HSTS", resp.StatusCode, resp.Proto,
			resp.Header.Get("Strict-Transport-Security"))
	}
	if resp, err := http.Get("http://" + o.HTTPAddr() + "/v1/runs"); err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Error("plaintext HTTP to the TLS listener was served")
		}
	}
}

// TestHTTPTenantQuota: over HTTP a verified key takes its tenant's slot
// before its body is read, as on gRPC: with --tenant-max-streams 2, two
// stalled requests of acme hold both, a third is 429 naming the tenant, and
// globex is served meanwhile.
func TestHTTPTenantQuota(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b, _, base := openHTTP(t, node.BackendConfig{TenantMaxStreams: 2}, nil)
	acme, globex := newTenantKey(t, b, "acme"), newTenantKey(t, b, "globex")
	client := &http.Client{}
	// A first call verifies (and caches) each key.
	for _, k := range []string{acme, globex} {
		if code, _, out := call(ctx, t, client, "GET", base+"/v1/runs", k, "", ""); code != 200 {
			t.Fatalf("GET /v1/runs: %d %s", code, out)
		}
	}
	// stall opens a request of acme that sends its headers and a first
	// byte of its body, never its end.
	stall := func() net.Conn {
		conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		if _, err := conn.Write([]byte("POST " + startRunPath + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/proto\r\n" +
			"Connect-Protocol-Version: 1\r\nAuthorization: Bearer " + acme + "\r\nContent-Length: 1000\r\n\r\n\x0a")); err != nil {
			t.Fatal(err)
		}
		return conn
	}
	stalls := []net.Conn{stall(), stall()}
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, _, out := call(ctx, t, client, "GET", base+"/v1/runs", acme, "", "")
		if code == http.StatusTooManyRequests && strings.Contains(out, "tenant:acme") {
			break
		}
		// A stall that came in while a probe held a slot was itself
		// refused: it has an answer; open another in its place.
		for i, c := range stalls {
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
			if n, _ := c.Read(make([]byte, 1)); n > 0 {
				stalls[i] = stall()
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("acme's third call while two stall: %d %.200s; want 429 naming tenant:acme", code, out)
		}
	}
	if code, _, out := call(ctx, t, client, "GET", base+"/v1/runs", globex, "", ""); code != 200 {
		t.Errorf("globex while acme's quota is full: %d %.200s; want 200", code, out)
	}
}

// TestConnectStreamRefusalIsInTheStatus: a Connect-streaming call refused
// before its body is read (here WatchRun with a malformed key) is answered
// with its code in the HTTP status (401), as a Connect unary call is, not
// in the end-of-stream message of a 200: connect-go's client can lose the
// body of an answer that comes before it has sent its request, and with
// the streaming form one such call in about a hundred ended INTERNAL
// ("corrupt response: I/O error after end-stream message") on a loaded
// machine (TestEveryRPCIsScopedToTheCredentialsTenant in CI). 300 calls
// through connect-go are all UNAUTHENTICATED; a gRPC-Web call gets its
// status in the headers (trailers-only).
func TestConnectStreamRefusalIsInTheStatus(t *testing.T) {
	t.Parallel()
	_, _, base := openHTTP(t, node.BackendConfig{}, nil)
	const malformed = "fanout_fk_0123456789abcdef_nope"
	body := `{"runId":"r_00000000000000000000000000000000"}`
	envelope := string([]byte{0, 0, 0, 0, byte(len(body))}) + body
	for _, tc := range []struct{ ct, want string }{
		{"application/connect+json", `"code":"unauthenticated"`},
		{"application/grpc-web+json", "16"},
	} {
		code, _, out := call(t.Context(), t, http.DefaultClient, http.MethodPost, base+fanoutv1.OrchestratorService_WatchRun_FullMethodName,
			malformed, tc.ct, envelope)
		wantCode := http.StatusUnauthorized
		if strings.HasPrefix(tc.ct, "application/grpc-web") {
			wantCode = http.StatusOK // trailers-only: grpc-status in the headers
		}
		if code != wantCode || !strings.Contains(out, tc.want) {
			t.Errorf("WatchRun as %s with a malformed key: %d %q; want %d with %s", tc.ct, code, out, wantCode, tc.want)
		}
	}
	cl := connect.NewClient[fanoutv1.WatchRunRequest, fanoutv1.WatchRunResponse](http.DefaultClient,
		base+fanoutv1.OrchestratorService_WatchRun_FullMethodName, connect.WithProtoJSON())
	got := map[string]int{}
	for range 300 {
		r := connect.NewRequest(&fanoutv1.WatchRunRequest{RunId: "r_00000000000000000000000000000000"})
		r.Header().Set("Authorization", "Bearer "+malformed)
		st, err := cl.CallServerStream(t.Context(), r)
		if err == nil {
			for st.Receive() {
			}
			err = st.Err()
			_ = st.Close()
		}
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			got[err.Error()]++
		}
	}
	if len(got) > 0 {
		t.Errorf("of 300 WatchRun calls through connect-go with a malformed key, not UNAUTHENTICATED: %v", got)
	}
}
