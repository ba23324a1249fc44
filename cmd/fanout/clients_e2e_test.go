package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/subagent/mcp"
)

// clientSuiteTimeout bounds one client suite's run (issue 47: the client
// tests add at most 3 minutes to CI, both suites and their fleet).
const clientSuiteTimeout = 150 * time.Second

// TestClients runs the Python and the TypeScript clients' own test suites
// (clients/python/tests with pytest, clients/ts/test with node's test
// runner) against a real fleet this test starts: two worker processes,
// server-memory's create_entities as a write needing approval, and two
// orchestrators with API keys on — o1 in plaintext behind a proxy the
// suites can cut (POST /cut on FANOUT_TEST_CONTROL), o2 with TLS. The
// suites' contract (what each environment variable holds) is in
// clients/README.md.
func TestClients(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	env := startClientFleet(t)
	t.Run("python", func(t *testing.T) {
		python := filepath.Join(root, ".tmp", "py", "bin", "python")
		if _, err := os.Stat(python); err != nil {
			t.Fatalf("the Python client's suite runs in its virtual environment %s, which is missing: run `make python-env` "+
				"(Debian's python3-venv, python3-grpcio, python3-protobuf, python3-pytest; make test makes it)", python)
		}
		// The checkout's package first, whatever the venv's editable install
		// points at (scripts/mutants.sh runs this in a copy of the tree).
		env := append(env[:len(env):len(env)], "PYTHONPATH="+filepath.Join(root, "clients", "python", "src"))
		runClientSuite(t, env, root, python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "clients/python/tests")
	})
	t.Run("typescript", func(t *testing.T) {
		modules := filepath.Join(root, "clients", "ts", "node_modules")
		if _, err := os.Stat(modules); err != nil {
			t.Fatalf("the TypeScript client's suite needs its packages in %s, which are missing: run `make ts-client-deps` "+
				"(npm ci in clients/ts; make test runs it)", modules)
		}
		// One file at a time: a file's POST /cut must not reset another's calls.
		runClientSuite(t, env, root, "node", "--test", "--test-concurrency=1", "--test-reporter=dot", "clients/ts/test/")
	})
}

// runClientSuite runs a suite's command in dir with the fleet's environment
// and fails with its output if it fails or outlives clientSuiteTimeout.
func runClientSuite(t *testing.T, env []string, dir, name string, args ...string) {
	ctx, cancel := context.WithTimeout(t.Context(), clientSuiteTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start).Round(100 * time.Millisecond)
	if ctx.Err() != nil {
		t.Fatalf("%s %s did not finish within %s:\n%s", name, strings.Join(args, " "), clientSuiteTimeout, out)
	}
	if err != nil {
		t.Fatalf("%s %s: %v after %s:\n%s", name, strings.Join(args, " "), err, took, out)
	}
	t.Logf("%s %s passed in %s:\n%s", name, strings.Join(args, " "), took, tailLines(string(out), 8))
}

// startClientFleet starts the suites' fleet and returns the environment a
// suite runs with (this process's, FANOUT_* variables replaced).
func startClientFleet(t *testing.T) []string {
	t.Helper()
	tool := mcp.ModelName("memory", "create_entities")
	cfg, _, _ := memoryServerConfig(t, []any{map[string]any{"name": "create_entities", "effect": "write",
		"approval": "required", "approval_timeout": "2m"}})
	// Each task's one reply before its answer makes three writes.
	c := startWorkers(t, [][]string{
		{"--mcp-config", cfg, "--sim-tool-calls", "3", "--sim-finish-after", "2", "--sim-latency", "20ms"},
		{"--mcp-config", cfg, "--sim-tool-calls", "3", "--sim-finish-after", "2", "--sim-latency", "20ms"},
	})
	owner := c.url // `fanout tenant` and `fanout key` act as the database's owner
	admin(t, owner, "tenant", "create", "e2e")
	key := newKey(t, owner, "--tenant", "e2e", "--scopes", "run,read,cancel,approve,audit", "--name", "client-suite")

	dir := t.TempDir()
	ca, cert, certKey := writeServerTLS(t, dir)
	common := []string{"--auth", "keys", "--mcp-config", cfg, "--poll-interval", e2ePoll, "--sweep-interval", e2eSweep}
	o1 := startOrchestratorMain(t, c.url, c.workers, append([]string{"--name", "o1", "--http-listen", "127.0.0.1:0"}, common...)...)
	o2 := startOrchestratorMain(t, c.url, c.workers, append([]string{"--name", "o2", "--http-listen", "127.0.0.1:0",
		"--tls-cert", cert, "--tls-key", certKey}, common...)...)
	if o1.http == "" || o2.http == "" {
		t.Fatalf("an orchestrator logged no HTTP listener (o1 %q, o2 %q)", o1.http, o2.http)
	}
	grpcProxy := startProxy(t, o1.addr)
	httpURL, err := url.Parse(o1.http)
	if err != nil {
		t.Fatal(err)
	}
	httpProxy := startProxy(t, httpURL.Host)
	httpURL.Host = httpProxy.lis.Addr().String()
	tlsURL, err := url.Parse(o2.http)
	if err != nil {
		t.Fatal(err)
	}
	tlsURL.Scheme = "https"

	control := httptest.NewServer(clientControl(owner, grpcProxy, httpProxy))
	t.Cleanup(control.Close)

	specs := filepath.Join(dir, "specs")
	if err := os.Mkdir(specs, 0o700); err != nil {
		t.Fatal(err)
	}
	quick := e2eSpec("", 3, 1_000_000)
	approval := e2eSpec("", 1, 1_000_000)
	approval.Tasks[0].AllowedTools = []string{tool}
	for name, s := range map[string]*fanoutv1.RunSpec{"quick.json": quick, "approval.json": approval} {
		b, err := protojson.MarshalOptions{Indent: "  "}.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(specs, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FANOUT_") && !strings.HasPrefix(kv, "PYTHONPATH=") {
			env = append(env, kv)
		}
	}
	return append(env,
		"FANOUT_ADDR="+grpcProxy.lis.Addr().String(),
		"FANOUT_HTTP_URL="+httpURL.String(),
		"FANOUT_TLS_ADDR="+o2.addr,
		"FANOUT_TLS_HTTP_URL="+tlsURL.String(),
		"FANOUT_TLS_CA="+ca,
		"FANOUT_API_KEY="+key,
		"FANOUT_TEST_CONTROL="+control.URL,
		"FANOUT_TEST_SPECS="+specs,
		"PYTHONDONTWRITEBYTECODE=1", // no __pycache__ in the checkout
	)
}

// clientControl is the suites' control endpoint: POST /cut resets every
// connection open through the proxies (a dropped connection, as a client
// sees a load balancer restart) and goes on forwarding new ones; POST /key
// (body: scopes) makes a key of tenant e2e and answers its token; POST
// /revoke (body: a token) revokes its key.
func clientControl(owner string, proxies ...*tcpProxy) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /cut", func(w http.ResponseWriter, _ *http.Request) {
		n := 0
		for _, p := range proxies {
			n += p.drop()
		}
		_, _ = fmt.Fprintln(w, n)
	})
	mux.HandleFunc("POST /key", func(w http.ResponseWriter, r *http.Request) {
		scopes, _ := io.ReadAll(io.LimitReader(r.Body, 256))
		out, err := adminRun(owner, "key", "create", "--tenant", "e2e", "--scopes", strings.TrimSpace(string(scopes)))
		fields := strings.Fields(out)
		if err != nil || len(fields) == 0 {
			http.Error(w, fmt.Sprintf("key create: %v", err), http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, fields[len(fields)-1])
	})
	mux.HandleFunc("POST /revoke", func(w http.ResponseWriter, r *http.Request) {
		token, _ := io.ReadAll(io.LimitReader(r.Body, 256))
		if _, err := adminRun(owner, "key", "revoke", keyID(strings.TrimSpace(string(token)))); err != nil {
			http.Error(w, fmt.Sprintf("key revoke: %v", err), http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "revoked\n")
	})
	return mux
}

// adminRun is admin for a handler: `fanout ARGS --database-url url`, its
// stdout or an error with its stderr.
func adminRun(url string, args ...string) (string, error) {
	var out, errOut bytes.Buffer
	args = append(args, "--database-url", url)
	if code := Main(context.Background(), args, &out, &errOut, func(string) string { return "" }); code != 0 {
		return "", fmt.Errorf("fanout %s: exit %d: %s", args[0]+" "+args[1], code, errOut.String())
	}
	return out.String(), nil
}

// writeServerTLS writes a test CA and a caller-facing server certificate
// for 127.0.0.1 and localhost signed by it into dir, and returns the paths
// of the CA's certificate, the server's certificate and its key.
func writeServerTLS(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fanout client-suite CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER),
		write("server-key.pem", "PRIVATE KEY", keyDER)
}
