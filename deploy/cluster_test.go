//go:build cluster

// The chart on a real cluster (issue 27, tiers 2 and 3): a control plane
// built from k8s.io/kubernetes v1.37.2 (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler), with kwok's fake nodes
// (cluster_api_test.go) or a real kubelet, containerd and runc
// (cluster_node_test.go). `make k8s-e2e` builds the binaries once per machine
// (.ci/k8s/build.sh) and runs these tests with -tags cluster.
package deploy_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// k8sBinEnv names the directory holding kube-apiserver,
// kube-controller-manager, kube-scheduler, kubelet and kwok.
const k8sBinEnv = "FANOUT_K8S_BIN"

// controlPlane is a running etcd, API server, controller manager and
// scheduler on loopback, each a child process whose log is in dir.
type controlPlane struct {
	dir, bin   string
	caFile     string
	saKey      string
	kubeconfig string
	token      string
	server     string // https://127.0.0.1:PORT
	cfg        *rest.Config
	cs         *kubernetes.Clientset
	restMapper *restmapper.DeferredDiscoveryRESTMapper
}

// k8sBin returns the binaries' directory, or fails the test saying how to get it.
func k8sBin(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(k8sBinEnv)
	if dir == "" {
		t.Fatalf("%s is not set: run `make k8s-e2e`, which builds the Kubernetes binaries once per machine "+
			"(.ci/k8s/build.sh, about 16 min cold on 2 cores) and runs these tests", k8sBinEnv)
	}
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kwok"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Fatalf("%s: %v (build it with .ci/k8s/build.sh)", k8sBinEnv, err)
		}
	}
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Fatal("etcd is not on PATH: apt-get install -y etcd-server (.ci/run installs it)")
	}
	return dir
}

// startControlPlane starts etcd, the API server, the controller manager and
// the scheduler, and returns once the API server is ready and the default
// namespace has its service account (pods are refused without it).
func startControlPlane(t *testing.T, ctx context.Context) *controlPlane {
	t.Helper()
	cp := &controlPlane{dir: t.TempDir(), bin: k8sBin(t), token: "fanout-cluster-test-" + randHex(t, 8)}
	cp.writePKI(t)

	etcdPort, peerPort, apiPort := freePort(t), freePort(t), freePort(t)
	cp.run(t, "etcd", "etcd",
		"--data-dir="+filepath.Join(cp.dir, "etcd"),
		"--listen-client-urls=http://127.0.0.1:"+strconv.Itoa(etcdPort),
		"--advertise-client-urls=http://127.0.0.1:"+strconv.Itoa(etcdPort),
		"--listen-peer-urls=http://127.0.0.1:"+strconv.Itoa(peerPort),
		"--initial-advertise-peer-urls=http://127.0.0.1:"+strconv.Itoa(peerPort),
		"--initial-cluster=default=http://127.0.0.1:"+strconv.Itoa(peerPort),
		"--unsafe-no-fsync")

	tokens := filepath.Join(cp.dir, "tokens.csv")
	writeFile(t, tokens, cp.token+`,admin,admin,"system:masters"`+"\n")
	p := func(name string) string { return filepath.Join(cp.dir, name) }
	cp.run(t, "kube-apiserver", filepath.Join(cp.bin, "kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:"+strconv.Itoa(etcdPort),
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(apiPort),
		"--tls-cert-file="+p("apiserver.crt"), "--tls-private-key-file="+p("apiserver.key"),
		"--client-ca-file="+p("ca.crt"),
		"--token-auth-file="+tokens,
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+p("sa.pub"),
		"--service-account-signing-key-file="+p("sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--profiling=false")
	cp.server = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	cp.kubeconfig = p("kubeconfig")
	writeFile(t, cp.kubeconfig, fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: admin, user: {token: %q}}]
contexts: [{name: test, context: {cluster: test, user: admin}}]
current-context: test
`, cp.server, p("ca.crt"), cp.token))
	cp.cfg = &rest.Config{Host: cp.server, BearerToken: cp.token, TLSClientConfig: rest.TLSClientConfig{CAFile: p("ca.crt")}, QPS: 100, Burst: 200}
	var err error
	if cp.cs, err = kubernetes.NewForConfig(cp.cfg); err != nil {
		t.Fatal(err)
	}
	cp.waitReady(t, ctx)

	cp.run(t, "kube-controller-manager", filepath.Join(cp.bin, "kube-controller-manager"),
		"--kubeconfig="+cp.kubeconfig, "--leader-elect=false", "--secure-port=0",
		"--service-account-private-key-file="+p("sa.key"), "--root-ca-file="+p("ca.crt"),
		"--use-service-account-credentials=false", "--controllers=*",
		"--node-monitor-grace-period=10m", "--concurrent-deployment-syncs=2")
	cp.run(t, "kube-scheduler", filepath.Join(cp.bin, "kube-scheduler"),
		"--kubeconfig="+cp.kubeconfig, "--leader-elect=false", "--secure-port=0")
	poll(t, ctx, time.Minute, "the default service account", func() (bool, error) {
		_, err := cp.cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	return cp
}

// waitReady polls /readyz with the admin token.
func (cp *controlPlane) waitReady(t *testing.T, ctx context.Context) {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(readFile(t, filepath.Join(cp.dir, "ca.crt")))
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	poll(t, ctx, 90*time.Second, "kube-apiserver /readyz", func() (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", cp.server+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+cp.token)
		resp, err := client.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == 200, nil
	})
}

// writePKI writes the cluster CA, the API server's serving certificate and
// the service-account signing key pair.
func (cp *controlPlane) writePKI(t *testing.T) {
	t.Helper()
	caKey := newKey(t)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fanout-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	cp.caFile = filepath.Join(cp.dir, "ca.crt")
	writeFile(t, cp.caFile, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})))

	srvKey := newKey(t)
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(cp.dir, "apiserver.crt"), string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER})))
	writeKey(t, filepath.Join(cp.dir, "apiserver.key"), srvKey)

	saKey := newKey(t)
	cp.saKey = filepath.Join(cp.dir, "sa.key")
	writeKey(t, cp.saKey, saKey)
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(cp.dir, "sa.pub"), string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})))
}

// run starts a child process logging to dir/name.log. It is stopped (SIGTERM,
// then SIGKILL after 10 s) when the test ends; if the test failed, the end
// of its log is printed.
func (cp *controlPlane) run(t *testing.T, name, bin string, args ...string) *exec.Cmd {
	t.Helper()
	return runProcess(t, cp.dir, name, bin, args...)
}

func runProcess(t *testing.T, dir, name, bin string, args ...string) *exec.Cmd {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 2500 {
				b = b[len(b)-2500:]
			}
			t.Logf("--- end of %s's log (%s) ---\n%s", name, logPath, b)
		}
	})
	return cmd
}

// poll calls cond until it returns true, and fails the test, naming cond's
// last error, if the deadline passes first. An error does not end the wait.
func poll(t *testing.T, ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if err != nil {
			last = err
		}
		if ok {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s: not within %s (last error: %v)", what, timeout, last)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// modDir returns the module cache directory of module@version, downloading
// its zip through the Go module proxy if needed (the CRDs ship in the
// operators' module zips).
func modDir(t *testing.T, mod string) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", mod).Output()
	if err != nil {
		t.Fatalf("go mod download %s: %v", mod, err)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		t.Fatalf("go mod download %s: %s %v", mod, m.Error, err)
	}
	return m.Dir
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writeKey(t *testing.T, path string, k *ecdsa.PrivateKey) {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})))
}

func randHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", b)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSpace(b)
}
