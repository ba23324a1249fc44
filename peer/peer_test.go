package peer

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// handshake is what both ends of one TLS connection saw.
type handshake struct {
	server    tls.ConnectionState
	serverErr error // the server's handshake
	client    tls.ConnectionState
	clientErr error // the client's handshake
	readErr   error // the client reading the server's first bytes
}

// connect runs one TLS connection over loopback between server and client.
// On success the server writes "ok" and the client reads it: in TLS 1.3 the
// client's handshake returns before the server has checked the client's
// certificate, so only the read shows the client a refusal.
func connect(t *testing.T, server, client *tls.Config) handshake {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	deadline, _ := ctx.Deadline()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()

	type result struct {
		state tls.ConnectionState
		err   error
	}
	served := make(chan result, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			served <- result{err: err}
			return
		}
		defer func() { _ = conn.Close() }()
		_ = conn.SetDeadline(deadline)
		tc := tls.Server(conn, server)
		if err := tc.HandshakeContext(ctx); err != nil {
			served <- result{err: err}
			return
		}
		_, err = tc.Write([]byte("ok"))
		served <- result{state: tc.ConnectionState(), err: err}
	}()

	var h handshake
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(deadline)
	tc := tls.Client(conn, client)
	if h.clientErr = tc.HandshakeContext(ctx); h.clientErr == nil {
		h.client = tc.ConnectionState()
		buf := make([]byte, 2)
		if _, h.readErr = io.ReadFull(tc, buf); h.readErr == nil && string(buf) != "ok" {
			h.readErr = fmt.Errorf("read %q, want \"ok\"", buf)
		}
	}
	_ = tc.Close()

	select {
	case r := <-served:
		h.server, h.serverErr = r.state, r.err
	case <-ctx.Done():
		t.Fatal("server did not finish its handshake in time")
	}
	return h
}

func generateDev(t *testing.T) DevFiles {
	t.Helper()
	df, err := GenerateDev(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return df
}

func serverConfig(t *testing.T, files Files, accept Role) *tls.Config {
	t.Helper()
	cfg, err := ServerConfig(files, accept)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func clientConfig(t *testing.T, files Files, want Role) *tls.Config {
	t.Helper()
	cfg, err := ClientConfig(files, want)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// presenting returns cfg changed to present the key pair in files, whatever
// the server asks for, while still verifying the server as cfg does.
func presenting(t *testing.T, cfg *tls.Config, files Files) *tls.Config {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(files.Cert, files.Key)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Certificates = nil
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
	return cfg
}

func TestHandshakeOrchestratorToWorker(t *testing.T) {
	t.Parallel()
	df := generateDev(t)
	// A worker found through dns:/// or by IP is dialed under a name its
	// certificate does not list; the role is what identifies it.
	for _, serverName := range []string{"", "localhost", "worker-3.workers.fanout.svc.cluster.local"} {
		t.Run("ServerName="+serverName, func(t *testing.T) {
			t.Parallel()
			client := clientConfig(t, df.Orchestrator, RoleWorker)
			client.ServerName = serverName
			h := connect(t, serverConfig(t, df.Worker, RoleOrchestrator), client)
			if h.serverErr != nil || h.clientErr != nil || h.readErr != nil {
				t.Fatalf("server: %v; client: %v; read: %v", h.serverErr, h.clientErr, h.readErr)
			}
			if r, ok := RoleOf(h.server.PeerCertificates[0]); !ok || r != RoleOrchestrator {
				t.Errorf("server sees role %q (%v), want %q", r, ok, RoleOrchestrator)
			}
			if r, ok := RoleOf(h.client.PeerCertificates[0]); !ok || r != RoleWorker {
				t.Errorf("client sees role %q (%v), want %q", r, ok, RoleWorker)
			}
			if h.server.Version != tls.VersionTLS13 {
				t.Errorf("version %x, want TLS 1.3", h.server.Version)
			}
		})
	}
}

// assertRefusedByRole checks that err is the role check's refusal, wanting
// role want and naming the URI SANs the peer had.
func assertRefusedByRole(t *testing.T, err error, want Role, had string) {
	t.Helper()
	var re *roleError
	if !errors.As(err, &re) {
		t.Fatalf("error %v, want a role refusal", err)
	}
	if re.want != want {
		t.Errorf("refusal wants %q, want %q", re.want, want)
	}
	for _, s := range []string{want.URI().String(), had} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not name %s", err, s)
		}
	}
}

func TestServerRefusesWorkerAsOrchestrator(t *testing.T) {
	t.Parallel()
	df := generateDev(t)
	client := presenting(t, clientConfig(t, df.Orchestrator, RoleWorker), df.Worker)
	h := connect(t, serverConfig(t, df.Worker, RoleOrchestrator), client)
	assertRefusedByRole(t, h.serverErr, RoleOrchestrator, RoleWorker.URI().String())
	if h.readErr == nil && h.clientErr == nil {
		t.Error("client was not told it was refused")
	}
}

func TestServerRefusesClientFromAnotherCA(t *testing.T) {
	t.Parallel()
	df, other := generateDev(t), generateDev(t)
	// Same role, same CA name, another CA key.
	client := presenting(t, clientConfig(t, df.Orchestrator, RoleWorker), other.Orchestrator)
	h := connect(t, serverConfig(t, df.Worker, RoleOrchestrator), client)
	if !errors.As(h.serverErr, new(x509.UnknownAuthorityError)) {
		t.Fatalf("server: %v, want an unknown authority", h.serverErr)
	}
	if h.readErr == nil && h.clientErr == nil {
		t.Error("client was not told it was refused")
	}
}

func TestServerRefusesNoClientCert(t *testing.T) {
	t.Parallel()
	df := generateDev(t)
	client := clientConfig(t, df.Orchestrator, RoleWorker)
	client.Certificates = nil
	h := connect(t, serverConfig(t, df.Worker, RoleOrchestrator), client)
	if h.serverErr == nil {
		t.Fatal("server accepted a client without a certificate")
	}
	if h.readErr == nil && h.clientErr == nil {
		t.Error("client was not told it was refused")
	}
}

func TestClientRefusesServerWithoutWorkerRole(t *testing.T) {
	t.Parallel()
	df := generateDev(t)
	// The orchestrator's certificate is valid for server auth from the same
	// CA: only the role tells it from a worker's.
	h := connect(t, serverConfig(t, df.Orchestrator, RoleOrchestrator), clientConfig(t, df.Orchestrator, RoleWorker))
	assertRefusedByRole(t, h.clientErr, RoleWorker, RoleOrchestrator.URI().String())
	if h.serverErr == nil {
		t.Error("server was not told the client refused it")
	}
}

// The client skips crypto/tls's verification; this is the test that its own
// verification checks the chain.
func TestClientRefusesServerFromAnotherCA(t *testing.T) {
	t.Parallel()
	df, other := generateDev(t), generateDev(t)
	h := connect(t, serverConfig(t, other.Worker, RoleOrchestrator), clientConfig(t, df.Orchestrator, RoleWorker))
	if !errors.As(h.clientErr, new(x509.UnknownAuthorityError)) {
		t.Fatalf("client: %v, want an unknown authority", h.clientErr)
	}
}

func TestTLS13Only(t *testing.T) {
	t.Parallel()
	df := generateDev(t)
	t.Run("server refuses TLS 1.2", func(t *testing.T) {
		t.Parallel()
		client := clientConfig(t, df.Orchestrator, RoleWorker)
		client.MinVersion, client.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
		if h := connect(t, serverConfig(t, df.Worker, RoleOrchestrator), client); h.serverErr == nil {
			t.Error("server accepted TLS 1.2")
		}
	})
	t.Run("client refuses TLS 1.2", func(t *testing.T) {
		t.Parallel()
		server := serverConfig(t, df.Worker, RoleOrchestrator)
		server.MinVersion, server.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
		if h := connect(t, server, clientConfig(t, df.Orchestrator, RoleWorker)); h.clientErr == nil {
			t.Error("client accepted TLS 1.2")
		}
	})
}

// issue writes a certificate from df's CA naming role, valid only for
// usage, and its key, and returns them as Files.
func issue(t *testing.T, df DevFiles, role Role, usage x509.ExtKeyUsage) Files {
	t.Helper()
	blocks, err := readPEM("CA", df.CA, "CERTIFICATE")
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(blocks[0].Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if blocks, err = readPEM("CA key", filepath.Join(filepath.Dir(df.CA), devCAKey), "PRIVATE KEY"); err != nil {
		t.Fatal(err)
	}
	caKey, err := x509.ParsePKCS8PrivateKey(blocks[0].Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := createCert(&x509.Certificate{
		NotBefore:   ca.NotBefore,
		NotAfter:    ca.NotAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{usage},
		URIs:        []*url.URL{role.URI()},
	}, ca, key.Public(), caKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f := Files{CA: df.CA, Cert: filepath.Join(dir, "cert.pem"), Key: filepath.Join(dir, "key.pem")}
	for _, w := range []pemFile{{f.Cert, "CERTIFICATE", der, 0o644}, {f.Key, "PRIVATE KEY", keyDER, 0o600}} {
		if err := w.write(); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// A certificate is good for one side of a handshake only if it says so.
func TestKeyUsage(t *testing.T) {
	t.Parallel()
	df := generateDev(t)
	t.Run("client refuses a worker certificate for client auth only", func(t *testing.T) {
		t.Parallel()
		worker := issue(t, df, RoleWorker, x509.ExtKeyUsageClientAuth)
		h := connect(t, serverConfig(t, worker, RoleOrchestrator), clientConfig(t, df.Orchestrator, RoleWorker))
		if !errors.As(h.clientErr, new(x509.CertificateInvalidError)) {
			t.Errorf("client: %v, want an invalid certificate", h.clientErr)
		}
	})
	t.Run("server refuses an orchestrator certificate for server auth only", func(t *testing.T) {
		t.Parallel()
		orch := issue(t, df, RoleOrchestrator, x509.ExtKeyUsageServerAuth)
		h := connect(t, serverConfig(t, df.Worker, RoleOrchestrator), clientConfig(t, orch, RoleWorker))
		if !errors.As(h.serverErr, new(x509.CertificateInvalidError)) {
			t.Errorf("server: %v, want an invalid certificate", h.serverErr)
		}
	})
}

// assertNoPEM fails if err quotes any line of the PEM bodies of files.
func assertNoPEM(t *testing.T, err error, files ...string) {
	t.Helper()
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	if strings.Contains(msg, "-----") {
		t.Errorf("error %q quotes PEM", msg)
	}
	for _, f := range files {
		data, rerr := os.ReadFile(f)
		if rerr != nil {
			continue // the missing file of the test
		}
		for line := range strings.Lines(string(data)) {
			line = strings.TrimSpace(line)
			if len(line) >= 8 && !strings.HasPrefix(line, "-----") && strings.Contains(msg, line) {
				t.Errorf("error %q quotes %s", msg, f)
			}
		}
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	df := generateDev(t)
	dir := filepath.Dir(df.CA)
	corrupt := filepath.Join(t.TempDir(), "corrupt-key.pem")
	key, err := os.ReadFile(df.Worker.Key)
	if err != nil {
		t.Fatal(err)
	}
	// A PEM block whose base64 decodes but whose DER does not parse.
	block, _ := pem.Decode(key)
	block.Bytes = block.Bytes[:len(block.Bytes)/2]
	if err := os.WriteFile(corrupt, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	tests := []struct {
		name  string
		files Files
		role  Role
		want  []string // the error names each
	}{
		{"unknown role", df.Worker, "admin", []string{`"admin"`}},
		{"missing CA", Files{missing, df.Worker.Cert, df.Worker.Key}, RoleOrchestrator, []string{missing}},
		{"CA is a key", Files{df.Worker.Key, df.Worker.Cert, df.Worker.Key}, RoleOrchestrator, []string{df.Worker.Key, `"PRIVATE KEY"`}},
		{"CA is a leaf", Files{df.Worker.Cert, df.Worker.Cert, df.Worker.Key}, RoleOrchestrator, []string{df.Worker.Cert, "not a CA"}},
		{"missing cert", Files{df.CA, missing, df.Worker.Key}, RoleOrchestrator, []string{missing}},
		{"missing key", Files{df.CA, df.Worker.Cert, missing}, RoleOrchestrator, []string{missing}},
		{"key is a cert", Files{df.CA, df.Worker.Cert, df.Worker.Cert}, RoleOrchestrator, []string{df.Worker.Cert}},
		{"key of another cert", Files{df.CA, df.Worker.Cert, df.Orchestrator.Key}, RoleOrchestrator, []string{df.Worker.Cert, df.Orchestrator.Key}},
		{"corrupt key", Files{df.CA, df.Worker.Cert, corrupt}, RoleOrchestrator, []string{corrupt}},
		{"cert names no role", Files{df.CA, df.CA, filepath.Join(dir, devCAKey)}, RoleOrchestrator, []string{df.CA, "no fanout role"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for side, load := range map[string]func(Files, Role) (*tls.Config, error){"server": ServerConfig, "client": ClientConfig} {
				cfg, err := load(tt.files, tt.role)
				if err == nil {
					t.Fatalf("%s: config %v, want an error", side, cfg != nil)
				}
				for _, w := range tt.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: error %q does not name %s", side, err, w)
					}
				}
				assertNoPEM(t, err, tt.files.CA, tt.files.Cert, tt.files.Key)
			}
		})
	}
}

func TestRole(t *testing.T) {
	t.Parallel()
	if got := RoleWorker.URI().String(); got != "spiffe://fanout/worker" {
		t.Errorf("worker URI %s", got)
	}
	if got := RoleOrchestrator.URI().String(); got != "spiffe://fanout/orchestrator" {
		t.Errorf("orchestrator URI %s", got)
	}
	cert := func(uris ...string) *x509.Certificate {
		c := &x509.Certificate{}
		for _, s := range uris {
			u, err := url.Parse(s)
			if err != nil {
				t.Fatal(err)
			}
			c.URIs = append(c.URIs, u)
		}
		return c
	}
	tests := []struct {
		uris []string
		want Role // "" for none
	}{
		{[]string{"spiffe://fanout/worker"}, RoleWorker},
		{[]string{"spiffe://fanout/orchestrator"}, RoleOrchestrator},
		{nil, ""},
		{[]string{"spiffe://fanout/orchestrator", "spiffe://fanout/worker"}, ""},
		{[]string{"spiffe://fanout/orchestrator", "https://example.com"}, ""},
		{[]string{"spiffe://other/orchestrator"}, ""},
		{[]string{"spiffe://fanout/orchestrator/x"}, ""},
		{[]string{"spiffe://fanout/orchestrator?x=1"}, ""},
		{[]string{"spiffe://fanout/admin"}, ""},
		{[]string{"https://fanout/orchestrator"}, ""},
	}
	for _, tt := range tests {
		r, ok := RoleOf(cert(tt.uris...))
		if r != tt.want || ok != (tt.want != "") {
			t.Errorf("RoleOf(%q) = %q, %v; want %q", tt.uris, r, ok, tt.want)
		}
	}
}

// devNames is every file GenerateDev writes.
var devNames = []string{devCA, devCAKey, devOrch, devOrchKey, devWorker, devWorkerKey, devSigningKey, devVerifyKey}

func readAll(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := make(map[string][]byte)
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = data
	}
	return files
}

func TestGenerateDev(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "dev")
	df, err := GenerateDev(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{df.CA, df.Orchestrator.CA, df.Orchestrator.Cert, df.Orchestrator.Key,
		df.Worker.CA, df.Worker.Cert, df.Worker.Key, df.SigningKey, df.VerifyKey} {
		if !filepath.IsAbs(p) || filepath.Dir(p) != dir {
			t.Errorf("path %s is not absolute in %s", p, dir)
		}
	}
	first := readAll(t, dir)
	if got := slices.Sorted(maps.Keys(first)); !slices.Equal(got, slices.Sorted(slices.Values(devNames))) {
		t.Errorf("files %v, want %v", got, devNames)
	}

	info, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o700 {
		t.Errorf("dir mode %v, want 0700", info.Mode().Perm())
	}
	for _, name := range []string{devCAKey, devOrchKey, devWorkerKey, devSigningKey} {
		info, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", name, info.Mode().Perm())
		}
	}

	again, err := GenerateDev(dir)
	if err != nil {
		t.Fatal(err)
	}
	if again != df {
		t.Errorf("second call's files %+v, want %+v", again, df)
	}
	for name, data := range readAll(t, dir) {
		if !bytes.Equal(data, first[name]) {
			t.Errorf("second call rewrote %s", name)
		}
	}

	// A set missing a file, or mixing two sets, is replaced whole.
	other := generateDev(t)
	for name, spoil := range map[string]func() error{
		"missing key":    func() error { return os.Remove(df.Worker.Key) },
		"another set CA": func() error { return copyFile(other.CA, df.CA) },
	} {
		before := readAll(t, dir)
		if err := spoil(); err != nil {
			t.Fatal(err)
		}
		if _, err := GenerateDev(dir); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		after := readAll(t, dir)
		for _, n := range devNames {
			if bytes.Equal(after[n], before[n]) {
				t.Errorf("%s: %s was kept", name, n)
			}
		}
		if err := df.usable(filepath.Join(dir, devCAKey), time.Now()); err != nil {
			t.Errorf("%s: regenerated set: %v", name, err)
		}
	}
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o644)
}
