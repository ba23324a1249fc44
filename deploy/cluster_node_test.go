//go:build cluster

package deploy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The pod network of the node test: a bridge the test makes, the CNI bridge
// plugin's subnet, and the host's address on it (the gateway, where the
// test's cluster DNS and its PostgreSQL proxy listen).
const (
	podBridge  = "fanout0"
	podSubnet  = "10.244.0.0/24"
	hostOnPods = "10.244.0.1"
	nodeName   = "fanout-node"
	pauseImage = "localhost/pause:fanout-test"
)

// node is a real node: containerd (with runc and the CNI plugins of the
// distribution) and a kubelet registered with the control plane.
type node struct {
	dir    string
	socket string
}

// requireNodeTools fails the test, saying how to get them, if the real
// node's tools are missing.
func requireNodeTools(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the node test runs containers: run it as root (make k8s-e2e in .ci/run does)")
	}
	for _, tool := range []string{"containerd", "ctr", "runc", "podman", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not on PATH: apt-get install -y containerd runc podman iproute2 (.ci/run installs them)", tool)
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		t.Fatal("the CNI plugins are missing: apt-get install -y containernetworking-plugins (.ci/run installs them)")
	}
}

// makePodBridge creates the pod bridge with the host's address on it, so
// that the test's services can listen there before the first pod exists;
// the CNI bridge plugin adopts it.
func makePodBridge(t *testing.T) {
	t.Helper()
	_ = exec.Command("ip", "link", "del", podBridge).Run() // left by a killed run
	for _, args := range [][]string{
		{"link", "add", podBridge, "type", "bridge"},
		{"addr", "add", hostOnPods + "/24", "dev", podBridge},
		{"link", "set", podBridge, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", podBridge).Run() })
}

// startNode starts containerd and the kubelet, loads the pause image and
// the images named by archives into containerd, and waits until the node
// is Ready. It stops every container and unmounts the kubelet's volumes
// when the test ends.
func (cp *controlPlane) startNode(t *testing.T, ctx context.Context, archives ...string) *node {
	t.Helper()
	n := &node{dir: filepath.Join(cp.dir, "node")}
	n.socket = filepath.Join(n.dir, "containerd.sock")
	for _, d := range []string{"cni", "cni-ipam", "kubelet", "containerd"} {
		if err := os.MkdirAll(filepath.Join(n.dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(n.dir, "cni", "10-fanout.conflist"), fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "fanout-test",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q, "gateway": %q}]],
              "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
    {"type": "loopback"}
  ]
}
`, podBridge, podSubnet, hostOnPods, filepath.Join(n.dir, "cni-ipam")))
	// containerd is configured by its own file (containerd -c), never /etc.
	// restrict_oom_score_adj: without it every sandbox fails here ("can't
	// get final child's PID from pipe"); cgroupfs, not systemd.
	writeFile(t, filepath.Join(n.dir, "containerd.toml"), fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[ttrpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
`, filepath.Join(n.dir, "containerd", "root"), filepath.Join(n.dir, "containerd", "state"), n.socket,
		n.socket+".ttrpc", pauseImage, filepath.Join(n.dir, "cni")))
	netnsBefore := netnsNames()
	rulesBefore := iptablesRules()
	runProcess(t, n.dir, "containerd", "containerd", "-c", filepath.Join(n.dir, "containerd.toml"))
	poll(t, ctx, 30*time.Second, "containerd's socket", func() (bool, error) {
		return exec.Command("ctr", "-a", n.socket, "version").Run() == nil, nil
	})
	// Registered after containerd's own cleanup, so it runs before it: stop
	// every container, unmount what the kubelet mounted, remove the pods'
	// network namespaces.
	t.Cleanup(func() { n.teardown(t, netnsBefore); restoreIPTables(t, rulesBefore) })
	t.Cleanup(func() {
		if t.Failed() {
			cp.dumpPods(t)
		}
	})

	n.importImage(t, ctx, buildPauseImage(t, ctx, n.dir))
	for _, a := range archives {
		n.importImage(t, ctx, a)
	}

	writeFile(t, filepath.Join(n.dir, "kubelet.yaml"), fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
address: %s
port: %d
readOnlyPort: 0
healthzPort: 0
containerRuntimeEndpoint: unix://%s
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failCgroupV1: false
failSwapOn: false
clusterDNS: [%s]
clusterDomain: cluster.local
resolvConf: %s
podCIDR: %s
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", imagefs.available: "1%%"}
imageGCHighThresholdPercent: 100
serializeImagePulls: false
makeIPTablesUtilChains: false
podLogsDir: %s
`, hostOnPods, freePort(t), n.socket, hostOnPods, filepath.Join(n.dir, "resolv.conf"), podSubnet, filepath.Join(n.dir, "pod-logs")))
	// The pods' resolv.conf search path only: names outside the cluster
	// are not resolved (there is no network beyond loopback and the bridge).
	writeFile(t, filepath.Join(n.dir, "resolv.conf"), "nameserver "+hostOnPods+"\n")
	runProcess(t, n.dir, "kubelet", filepath.Join(cp.bin, "kubelet"),
		"--config="+filepath.Join(n.dir, "kubelet.yaml"),
		"--kubeconfig="+cp.kubeconfig,
		"--root-dir="+filepath.Join(n.dir, "kubelet"),
		"--cert-dir="+filepath.Join(n.dir, "kubelet", "pki"),
		"--hostname-override="+nodeName,
		"--node-ip="+hostOnPods)
	poll(t, ctx, 2*time.Minute, "node "+nodeName+" Ready", func() (bool, error) {
		nd, err := cp.cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range nd.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, fmt.Errorf("Ready=%s: %s", c.Status, c.Message)
			}
		}
		return false, nil
	})
	return n
}

// buildPauseImage builds the sandbox image (pause/main.go, static, FROM
// scratch) with podman and returns its OCI archive.
func buildPauseImage(t *testing.T, ctx context.Context, dir string) string {
	t.Helper()
	ctxDir := filepath.Join(dir, "pause")
	if err := os.MkdirAll(ctxDir, 0o755); err != nil {
		t.Fatal(err)
	}
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", filepath.Join(ctxDir, "pause"), "./pause")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build pause: %v: %s", err, out)
	}
	writeFile(t, filepath.Join(ctxDir, "Containerfile"), "FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT [\"/pause\"]\n")
	archive := filepath.Join(dir, "pause.oci.tar")
	for _, args := range [][]string{
		{"build", "--quiet", "--pull=never", "--timestamp", "0", "-t", pauseImage, ctxDir},
		{"save", "--quiet", "--format", "oci-archive", "-o", archive, pauseImage},
	} {
		cmd := exec.CommandContext(ctx, "podman", args...)
		cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+mustAbs(t, "image/containers.conf"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("podman %s: %v: %s", args[0], err, out)
		}
	}
	return archive
}

// importImage loads an OCI archive into containerd's CRI namespace.
func (n *node) importImage(t *testing.T, ctx context.Context, archive string) {
	t.Helper()
	if out, err := n.ctr(2*time.Minute, "images", "import", archive); err != nil {
		t.Fatalf("ctr images import %s: %v: %s", archive, err, out)
	}
}

// imageDigest returns the manifest digest containerd holds for ref, and
// names the image by it too (REPO@DIGEST), as a pull by digest would: the
// kubelet finds an image by digest only under such a name.
func (n *node) imageDigest(t *testing.T, ref string) string {
	t.Helper()
	d := n.manifestDigest(t, ref)
	repo, _, _ := strings.Cut(ref, ":")
	if out, err := n.ctr(10*time.Second, "images", "tag", ref, repo+"@"+d); err != nil {
		t.Fatalf("ctr images tag: %v: %s", err, out)
	}
	return d
}

// ctr runs ctr against the node's containerd in the CRI namespace, within timeout.
func (n *node) ctr(timeout time.Duration, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return exec.CommandContext(ctx, "ctr", append([]string{"-a", n.socket, "-n", "k8s.io"}, args...)...).CombinedOutput()
}

func (n *node) manifestDigest(t *testing.T, ref string) string {
	t.Helper()
	out, err := n.ctr(10*time.Second, "images", "ls", "name=="+ref)
	if err != nil {
		t.Fatalf("ctr images ls: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == ref {
			return f[2]
		}
	}
	t.Fatalf("containerd has no image %s:\n%s", ref, out)
	return ""
}

// teardown kills every container of the node, unmounts what the kubelet
// mounted under its directory and removes the network namespaces the pods
// had, so that the test's directory can be removed and nothing outlives it.
func (n *node) teardown(t *testing.T, netnsBefore []string) {
	out, _ := n.ctr(10*time.Second, "tasks", "ls", "-q")
	for _, id := range strings.Fields(string(out)) {
		_, _ = n.ctr(10*time.Second, "tasks", "kill", "-s", "SIGKILL", id)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		out, _ := n.ctr(10*time.Second, "tasks", "ls", "-q")
		running := 0
		for _, id := range strings.Fields(string(out)) {
			if _, err := n.ctr(10*time.Second, "tasks", "delete", id); err != nil {
				running++
			}
		}
		if running == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond) // a SIGKILLed task is reaped within milliseconds
	}
	unmountUnder(t, n.dir)
	for _, ns := range netnsNames() {
		if !slices.Contains(netnsBefore, ns) && strings.HasPrefix(ns, "cni-") {
			p := filepath.Join("/var/run/netns", ns)
			_ = syscall.Unmount(p, syscall.MNT_DETACH)
			_ = os.Remove(p)
		}
	}
}

func netnsNames() []string {
	entries, _ := os.ReadDir("/var/run/netns")
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// unmountUnder lazily unmounts every mount point under dir, deepest first.
func unmountUnder(t *testing.T, dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Log(err)
		return
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			points = append(points, fields[4])
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil {
			t.Logf("unmount %s: %v", p, err)
		}
	}
}

// serveClusterDNS answers the pods' DNS queries on hostOnPods:53 from the
// API, as CoreDNS's kubernetes plugin does for what this test needs:
// SERVICE.NAMESPACE.svc.cluster.local is a headless Service's ready
// endpoint addresses (EndpointSlices) or a Service's cluster IP; every other
// name does not exist.
func (cp *controlPlane) serveClusterDNS(t *testing.T, ctx context.Context) {
	t.Helper()
	pc, err := net.ListenPacket("udp", hostOnPods+":53")
	if err != nil {
		t.Fatalf("cluster DNS: %v", err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if resp := cp.answerDNS(ctx, buf[:n]); resp != nil {
				_, _ = pc.WriteTo(resp, from)
			}
		}
	}()
}

func (cp *controlPlane) answerDNS(ctx context.Context, query []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	ips, found, err := cp.lookupService(ctx, strings.ToLower(q.Name.String()))
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RCode: dnsmessage.RCodeSuccess}
	switch {
	case err != nil:
		rh.RCode = dnsmessage.RCodeServerFailure // the resolver tries again
	case !found:
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	_ = b.StartQuestions()
	_ = b.Question(q)
	_ = b.StartAnswers()
	if q.Type == dnsmessage.TypeA {
		for _, ip := range ips {
			var a [4]byte
			copy(a[:], ip.To4())
			_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}, dnsmessage.AResource{A: a})
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// lookupService resolves SERVICE.NAMESPACE.svc.cluster.local: found is
// false for a name that does not exist, err set when the API could not say.
func (cp *controlPlane) lookupService(ctx context.Context, name string) (ips []net.IP, found bool, err error) {
	rest, ok := strings.CutSuffix(name, ".svc.cluster.local.")
	if !ok {
		return nil, false, nil
	}
	svcName, ns, ok := strings.Cut(rest, ".")
	if !ok || strings.Contains(ns, ".") {
		return nil, false, nil
	}
	svc, err := cp.cs.CoreV1().Services(ns).Get(ctx, svcName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		return nil, false, nil // a CNAME: nothing here uses one
	case svc.Spec.ClusterIP != corev1.ClusterIPNone:
		return []net.IP{net.ParseIP(svc.Spec.ClusterIP)}, true, nil
	}
	list, err := cp.cs.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svcName})
	if err != nil {
		return nil, false, err
	}
	for _, s := range list.Items {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			for _, a := range e.Addresses {
				if ip := net.ParseIP(a); ip != nil && ip.To4() != nil {
					ips = append(ips, ip)
				}
			}
		}
	}
	return ips, true, nil
}

// tcpProxy forwards every connection to listen on to target, so that a
// server bound to loopback is reachable from the pods. Its listener and
// every connection it holds are closed when the test ends.
func tcpProxy(t *testing.T, listen, target string) {
	t.Helper()
	l, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
		wg    sync.WaitGroup
	)
	track := func(c net.Conn, add bool) {
		mu.Lock()
		defer mu.Unlock()
		if add {
			conns[c] = true
		} else {
			delete(conns, c)
		}
	}
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				u, err := net.DialTimeout("tcp", target, 10*time.Second)
				if err != nil {
					c.Close()
					return
				}
				track(c, true)
				track(u, true)
				defer func() { track(c, false); track(u, false); c.Close(); u.Close() }()
				done := make(chan struct{})
				go func() { _, _ = io.Copy(u, c); u.(*net.TCPConn).CloseWrite(); close(done) }()
				_, _ = io.Copy(c, u)
				<-done
			})
		}
	})
}

// iptablesRules returns the host's iptables and ip6tables rules and chains
// (iptables -S of the filter, nat and mangle tables), one "CMD TABLE RULE"
// per line.
func iptablesRules() []string {
	var rules []string
	for _, cmd := range []string{"iptables", "ip6tables"} {
		for _, table := range []string{"filter", "nat", "mangle"} {
			out, err := exec.Command(cmd, "-t", table, "-S").Output()
			if err != nil {
				continue
			}
			for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				if l != "" {
					rules = append(rules, cmd+" "+table+" "+l)
				}
			}
		}
	}
	return rules
}

// restoreIPTables removes the rules, then the chains, that appeared since
// before: what the kubelet or a CNI plugin added to the host.
func restoreIPTables(t *testing.T, before []string) {
	var chains [][]string
	for _, r := range iptablesRules() {
		if slices.Contains(before, r) {
			continue
		}
		f := strings.Fields(r)
		cmd, table, op := f[0], f[1], f[2]
		switch op {
		case "-A":
			if out, err := exec.Command(cmd, append([]string{"-t", table, "-D"}, f[3:]...)...).CombinedOutput(); err != nil {
				t.Logf("%s -t %s -D %s: %v: %s", cmd, table, strings.Join(f[3:], " "), err, out)
			}
		case "-N":
			chains = append(chains, []string{cmd, table, f[3]})
		}
	}
	for _, c := range chains {
		_ = exec.Command(c[0], "-t", c[1], "-F", c[2]).Run()
		if out, err := exec.Command(c[0], "-t", c[1], "-X", c[2]).CombinedOutput(); err != nil {
			t.Logf("%s -t %s -X %s: %v: %s", c[0], c[1], c[2], err, out)
		}
	}
}

// dumpPods logs every pod's phase and containers' states, and the end of
// each container's log (the kubelet's podLogsDir), for a failed test.
func (cp *controlPlane) dumpPods(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pods, err := cp.cs.CoreV1().Pods(releaseNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("list pods: %v", err)
		return
	}
	for _, p := range pods.Items {
		var b strings.Builder
		fmt.Fprintf(&b, "pod %s on %q: %s %s", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.Message)
		for _, c := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, "\n  %s ready=%v restarts=%d", c.Name, c.Ready, c.RestartCount)
			if w := c.State.Waiting; w != nil {
				fmt.Fprintf(&b, " waiting %s: %s", w.Reason, w.Message)
			}
			if x := c.LastTerminationState.Terminated; x != nil {
				fmt.Fprintf(&b, " last exit %d %s", x.ExitCode, x.Reason)
			}
		}
		t.Log(b.String())
	}
	logs, _ := filepath.Glob(filepath.Join(cp.dir, "node", "pod-logs", releaseNamespace+"_*", "*", "*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		if len(b) > 1500 {
			b = b[len(b)-1500:]
		}
		t.Logf("--- %s ---\n%s", strings.TrimPrefix(l, cp.dir), b)
	}
}
