// Package deploy_test checks the Helm chart offline (issue 27, tier 1):
// rendered across value sets with the Helm library, linted, held to its
// values schema, every object decoded strictly into the Kubernetes and
// CloudNativePG API types, held to the project's own rules, and compared
// with golden files (go test ./... -update writes them).
package deploy_test

import (
	"bytes"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	cnpgv1 "github.com/cloudnative-pg/api/pkg/api/v1"
	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	clientscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "write the golden files of the rendered manifests")

const chartDir = "helm/fanout"

// minimalValues are the fewest values the chart renders with: the chart's
// defaults refuse a plaintext API and a NetworkPolicy that admits anyone,
// so an install names its caller TLS Secret and who may call.
const minimalValues = `
orchestrator: {tlsSecret: fanout-callers-tls}
networkPolicy:
  callers: [{podSelector: {matchLabels: {app.kubernetes.io/name: checkout}}}]
`

// valueSets are the value sets the chart is rendered with: each a name (its
// golden file) and the values over the chart's defaults.
var valueSets = []struct {
	name   string
	values string
}{
	{"minimal", minimalValues},
	{"full", `
image: {digest: "sha256:0000000000000000000000000000000000000000000000000000000000000000"}
database:
  admin: {secret: fanout-db-admin, key: url}
orchestrator:
  replicas: 3
  shutdownGraceSeconds: 60
  extraArgs: ["--log-level=debug"]
  tlsSecret: fanout-callers-tls
  http: {enabled: true, port: 8443, console: true}
worker:
  replicas: 5
  provider: openai
  providerSecret: fanout-providers
  providerKeys: [OPENAI_API_KEY, ANTHROPIC_API_KEY]
mcp:
  config: |
    servers:
      - name: github
        transport: http
        url: https://mcp.example.com/mcp
        token_file: /etc/fanout/mcp-secrets/github-mcp/token
  secrets: [github-mcp]
metrics: {serviceMonitor: true, prometheusRule: true}
networkPolicy:
  callers: [{namespaceSelector: {matchLabels: {team: checkout}}}]
`},
	{"behind-proxy", `
orchestrator:
  plaintextBehindProxy: true
  http: {enabled: true, plaintextBehindProxy: true}
networkPolicy: {allowAnyCaller: true}
`},
	{"cnpg", minimalValues + `
database:
  cnpg: {enabled: true, instances: 3, synchronousStandbys: 1, operator: {namespace: cnpg-operator}}
  admin: {secret: fanout-db-admin, key: url}
`},
}

// nodeValues are what TestClusterNode installs (cluster_e2e_test.go): the
// docs/kubernetes.md's values (the image by digest, AdminService's login), the image
// already on the node (no registry here), and a small fleet. The test dials
// the orchestrator pods in plaintext from the host, where a proxy ending TLS
// would stand, and the node's CNI enforces no NetworkPolicy: it says so.
func nodeValues(digest string) map[string]any {
	return map[string]any{
		"image":    map[string]any{"repository": "localhost/fanout", "digest": digest, "pullPolicy": "Never"},
		"database": map[string]any{"admin": map[string]any{"secret": "fanout-db-admin"}},
		"orchestrator": map[string]any{
			"replicas": 2, "shutdownGraceSeconds": 10,
			"plaintextBehindProxy": true,
			"requestBytes":         160 << 20, // within smallResources' 512 Mi
			"resources":            smallResources(),
		},
		"worker": map[string]any{
			"replicas": 2, "shutdownGraceSeconds": 10,
			"extraArgs": []any{"--sim-latency=400ms", "--sim-tool-calls=1", "--sim-finish-after=2", "--max-connection-age=3s"},
			"resources": smallResources(),
		},
		"networkPolicy": map[string]any{"allowAnyCaller": true},
	}
}

func smallResources() map[string]any {
	return map[string]any{
		"requests": map[string]any{"cpu": "100m", "memory": "64Mi"},
		"limits":   map[string]any{"cpu": "1", "memory": "512Mi"},
	}
}

// valuesMap parses values written as YAML.
func valuesMap(t *testing.T, values string) map[string]any {
	t.Helper()
	vals := map[string]any{}
	if err := yaml.Unmarshal([]byte(values), &vals); err != nil {
		t.Fatal(err)
	}
	return vals
}

// render renders the chart with the values over its defaults.
func render(t *testing.T, values string) map[string]string {
	t.Helper()
	out, err := tryRender(t, valuesMap(t, values))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tryRender renders the chart with the values over its defaults, returning
// the error of a template that refuses them.
func tryRender(t *testing.T, vals map[string]any) (map[string]string, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, common.ReleaseOptions{Name: "fanout", Namespace: "fanout", Revision: 1, IsInstall: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return engine.Render(ch, rv)
}

// objects decodes every document of the rendered templates strictly (an
// unknown or misspelled field is an error) into its API type.
func objects(t *testing.T, rendered map[string]string) []runtime.Object {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientscheme.AddToScheme, cnpgv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	decode := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	var objs []runtime.Object
	for _, name := range slices.Sorted(maps.Keys(rendered)) {
		for i, doc := range strings.Split(rendered[name], "\n---") {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			var head struct{ APIVersion, Kind string }
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				t.Fatalf("%s document %d: %v", name, i, err)
			}
			if head.APIVersion == "monitoring.coreos.com/v1" {
				continue // the Prometheus operator's types are not a dependency here
			}
			obj, _, err := decode.Decode([]byte(doc), nil, nil)
			if err != nil {
				t.Fatalf("%s document %d (%s): %v", name, i, head.Kind, err)
			}
			objs = append(objs, obj)
		}
	}
	return objs
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// TestChartLints: helm lint, with each value set, finds nothing.
func TestChartLints(t *testing.T) {
	for _, vs := range valueSets {
		vals := map[string]any{}
		if err := yaml.Unmarshal([]byte(vs.values), &vals); err != nil {
			t.Fatal(err)
		}
		for _, m := range lint.RunAll(chartDir, vals, "fanout").Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("%s: %s", vs.name, m)
			}
		}
	}
}

// TestChartValuesSchema: the schema refuses a misspelled key, a value of
// the wrong type and one outside its enum, naming it.
func TestChartValuesSchema(t *testing.T) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct{ values, want string }{
		{`worker: {replica: 3}`, "replica"},
		{`worker: {replicas: "3"}`, "replicas"},
		{`worker: {provider: gemini}`, "provider"},
		{`image: {digest: "latest"}`, "digest"},
		{`orchestrator: {auth: maybe}`, "auth"},
		{`database: {cnpg: {instances: 1}}`, "instances"},
		{`worker: {extraArgs: ["log-level=debug"]}`, "extraArgs"},
		{`orchestrator: {http: {enabled: true, consol: true}}`, "consol"},
		{`orchestrator: {http: {port: 0}}`, "port"},
		{`orchestrator: {plaintextBehindProxy: "yes"}`, "plaintextBehindProxy"},
		{`networkPolicy: {allowAnyCaller: 1}`, "allowAnyCaller"},
		{`database: {cnpg: {operator: {namespace: ""}}}`, "namespace"},
	} {
		vals := map[string]any{}
		if err := yaml.Unmarshal([]byte(bad.values), &vals); err != nil {
			t.Fatal(err)
		}
		_, err := chartutil.ToRenderValues(ch, vals, common.ReleaseOptions{Name: "fanout", Namespace: "fanout"}, nil)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("values %s: %v; want refused, naming %s", bad.values, err, bad.want)
		}
	}
}

// TestChartRefusesPlaintextHTTP: the HTTP port without caller TLS renders
// only when the values say a proxy ends TLS (fanout itself refuses it).
func TestChartRefusesPlaintextHTTP(t *testing.T) {
	vals := valuesMap(t, `
orchestrator: {plaintextBehindProxy: true, http: {enabled: true}}
networkPolicy: {allowAnyCaller: true}
`)
	if _, err := tryRender(t, vals); err == nil || !strings.Contains(err.Error(), "orchestrator.http.plaintextBehindProxy") {
		t.Errorf("http enabled without tlsSecret: %v; want refused naming orchestrator.http.plaintextBehindProxy", err)
	}
}

// TestChartRefusesPlaintextGRPC: the chart's defaults refuse to render a
// plaintext gRPC API, naming the values that allow one; it renders with
// caller TLS, or in plaintext when the values say a proxy ends TLS, as the
// HTTP port.
func TestChartRefusesPlaintextGRPC(t *testing.T) {
	if _, err := tryRender(t, nil); err == nil {
		t.Error("the chart's defaults rendered; want refused (a plaintext API, a NetworkPolicy admitting anyone)")
	}
	_, err := tryRender(t, valuesMap(t, `networkPolicy: {allowAnyCaller: true}`))
	if err == nil || !strings.Contains(err.Error(), "orchestrator.tlsSecret") || !strings.Contains(err.Error(), "orchestrator.plaintextBehindProxy") {
		t.Errorf("the gRPC API without tlsSecret: %v; want refused naming orchestrator.tlsSecret and orchestrator.plaintextBehindProxy", err)
	}
	for _, c := range []struct {
		values string
		tls    bool
	}{
		{"orchestrator: {tlsSecret: fanout-callers-tls}\nnetworkPolicy: {allowAnyCaller: true}", true},
		{"orchestrator: {plaintextBehindProxy: true}\nnetworkPolicy: {allowAnyCaller: true}", false},
	} {
		args := orchestratorArgs(t, objects(t, render(t, c.values)))
		if !slices.Contains(args, "--listen=0.0.0.0:50051") || slices.Contains(args, "--tls-cert=/etc/fanout/tls/tls.crt") != c.tls {
			t.Errorf("values %q: orchestrator args %q; want --listen=0.0.0.0:50051, --tls-cert %v", c.values, args, c.tls)
		}
	}
}

// TestChartCallersAreExplicit: the orchestrators' NetworkPolicy admits the
// listed callers; with none listed the render fails unless the values say
// any pod and address is intended (allowAnyCaller), and not both.
func TestChartCallersAreExplicit(t *testing.T) {
	const tls = "orchestrator: {tlsSecret: fanout-callers-tls}\n"
	_, err := tryRender(t, valuesMap(t, tls))
	if err == nil || !strings.Contains(err.Error(), "networkPolicy.callers") || !strings.Contains(err.Error(), "networkPolicy.allowAnyCaller") {
		t.Errorf("no callers listed: %v; want refused naming networkPolicy.callers and networkPolicy.allowAnyCaller", err)
	}
	_, err = tryRender(t, valuesMap(t, tls+"networkPolicy: {allowAnyCaller: true, callers: [{podSelector: {}}]}"))
	if err == nil || !strings.Contains(err.Error(), "networkPolicy.callers") || !strings.Contains(err.Error(), "networkPolicy.allowAnyCaller") {
		t.Errorf("callers listed and allowAnyCaller: %v; want refused naming both", err)
	}

	pol := networkPolicy(t, objects(t, render(t, minimalValues)), "fanout-orchestrator")
	want := []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "checkout"}}}}
	if len(pol.Spec.Ingress) != 1 || !equality.Semantic.DeepEqual(pol.Spec.Ingress[0].From, want) {
		t.Errorf("callers listed: ingress %+v; want one rule from exactly %+v", pol.Spec.Ingress, want)
	}
	pol = networkPolicy(t, objects(t, render(t, tls+"networkPolicy: {allowAnyCaller: true}")), "fanout-orchestrator")
	if len(pol.Spec.Ingress) != 1 || pol.Spec.Ingress[0].From != nil {
		t.Errorf("allowAnyCaller: ingress %+v; want one rule from anyone", pol.Spec.Ingress)
	}
	for _, o := range objects(t, render(t, tls+"networkPolicy: {enabled: false}")) {
		if np, ok := o.(*networkingv1.NetworkPolicy); ok {
			t.Errorf("networkPolicy.enabled false: NetworkPolicy %s rendered", np.Name)
		}
	}
}

// TestChartDatabasePolicyScopedToOperator: the chart's PostgreSQL admits
// fanout's pods and its own instances from the release's namespace, and
// the CloudNativePG operator's pods only from the operator's namespace
// (database.cnpg.operator.namespace): never a pod of any namespace that
// labels itself as the operator.
func TestChartDatabasePolicyScopedToOperator(t *testing.T) {
	for _, c := range []struct{ values, namespace string }{
		{"database: {cnpg: {enabled: true}}", "cnpg-system"},
		{"database: {cnpg: {enabled: true, operator: {namespace: cnpg-operator}}}", "cnpg-operator"},
	} {
		pol := networkPolicy(t, objects(t, render(t, minimalValues+c.values)), "fanout-db")
		operator := 0
		for _, rule := range pol.Spec.Ingress {
			if len(rule.From) == 0 {
				t.Errorf("%s: an ingress rule from anyone: %+v", c.values, rule)
			}
			for _, peer := range rule.From {
				if peer.IPBlock != nil || peer.PodSelector == nil || len(peer.PodSelector.MatchLabels) == 0 {
					t.Errorf("%s: peer %+v; want pods selected by label", c.values, peer)
					continue
				}
				if peer.NamespaceSelector == nil {
					continue // the policy's own namespace: the release's
				}
				operator++
				ns := map[string]string{"kubernetes.io/metadata.name": c.namespace}
				pods := map[string]string{"app.kubernetes.io/name": "cloudnative-pg"}
				if !maps.Equal(peer.NamespaceSelector.MatchLabels, ns) || len(peer.NamespaceSelector.MatchExpressions) != 0 ||
					!maps.Equal(peer.PodSelector.MatchLabels, pods) {
					t.Errorf("%s: peer %+v from another namespace; want only the operator's pods (%v) in its namespace (%v)", c.values, peer, pods, ns)
				}
			}
		}
		if operator != 1 {
			t.Errorf("%s: %d peers from other namespaces; want one, the operator (its status probes on port 8000)", c.values, operator)
		}
	}
}

// TestChartCNPGOwnerMayCreateRoles: the chart's CloudNativePG cluster gives
// its application owner, the migrate Job's login, CREATEROLE at bootstrap:
// `fanout migrate` refuses an owner without it (it creates fanout's groups).
func TestChartCNPGOwnerMayCreateRoles(t *testing.T) {
	for _, o := range objects(t, render(t, minimalValues+"database: {cnpg: {enabled: true}}")) {
		c, ok := o.(*cnpgv1.Cluster)
		if !ok {
			continue
		}
		initdb := c.Spec.Bootstrap.InitDB
		if initdb == nil || !slices.Contains(initdb.PostInitApplicationSQL, "ALTER ROLE "+initdb.Owner+" CREATEROLE") {
			t.Errorf("Cluster %s: bootstrap %+v; want its owner given CREATEROLE (postInitApplicationSQL)", c.Name, initdb)
		}
		return
	}
	t.Fatal("no CloudNativePG Cluster rendered")
}

// TestChartRendersTheClusterTestsValues: the values the cluster tests
// install (run only by make k8s-e2e) render and keep the chart's rules.
func TestChartRendersTheClusterTestsValues(t *testing.T) {
	out, err := tryRender(t, nodeValues("sha256:"+strings.Repeat("0", 64)))
	if err != nil {
		t.Fatalf("TestClusterNode's values: %v", err)
	}
	checkRules(t, objects(t, out))
	checkRules(t, objects(t, render(t, minimalValues))) // TestClusterAPIServer's
}

// orchestratorArgs are the orchestrator container's arguments.
func orchestratorArgs(t *testing.T, objs []runtime.Object) []string {
	t.Helper()
	for _, o := range objs {
		if d, ok := o.(*appsv1.Deployment); ok && d.Name == "fanout-orchestrator" {
			return d.Spec.Template.Spec.Containers[0].Args
		}
	}
	t.Fatal("no Deployment fanout-orchestrator rendered")
	return nil
}

// networkPolicy is the NetworkPolicy of that name.
func networkPolicy(t *testing.T, objs []runtime.Object, name string) *networkingv1.NetworkPolicy {
	t.Helper()
	for _, o := range objs {
		if np, ok := o.(*networkingv1.NetworkPolicy); ok && np.Name == name {
			return np
		}
	}
	t.Fatalf("no NetworkPolicy %s rendered", name)
	return nil
}

// TestChartManifests: every value set renders objects that decode strictly
// and keep the project's rules; they match their golden files.
func TestChartManifests(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			rendered := render(t, vs.values)
			objs := objects(t, rendered)
			checkRules(t, objs)
			golden(t, vs.name, rendered)
		})
	}
}

// checkRules holds the objects to the chart's rules (docs/kubernetes.md):
// every container probed over gRPC on the probe port, secret mounts
// read-only, no secret in an environment variable, a grace period longer
// than the drain, the pod and container security contexts, resources, the
// worker Service headless, each PodDisruptionBudget selecting exactly one
// Deployment, CloudNativePG's synchronous standbys fewer than its instances.
func checkRules(t *testing.T, objs []runtime.Object) {
	t.Helper()
	var deployments []*appsv1.Deployment
	var pdbs []*policyv1.PodDisruptionBudget
	var jobs, services, clusters int
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.Deployment:
			deployments = append(deployments, o)
			checkPod(t, "Deployment "+o.Name, &o.Spec.Template.Spec, true)
			if strings.HasSuffix(o.Name, "-orchestrator") {
				checkOrchestratorMemory(t, o.Spec.Template.Spec.Containers[0])
			}
		case *batchv1.Job:
			jobs++
			checkPod(t, "Job "+o.Name, &o.Spec.Template.Spec, false)
		case *policyv1.PodDisruptionBudget:
			pdbs = append(pdbs, o)
			if o.Spec.MaxUnavailable == nil || o.Spec.MaxUnavailable.IntValue() != 1 {
				t.Errorf("PodDisruptionBudget %s: maxUnavailable %v, want 1", o.Name, o.Spec.MaxUnavailable)
			}
		case *corev1.Service:
			services++
			if strings.HasSuffix(o.Name, "-worker") && o.Spec.ClusterIP != corev1.ClusterIPNone {
				t.Errorf("Service %s: clusterIP %q, want None (headless: the orchestrators' dns:/// target)", o.Name, o.Spec.ClusterIP)
			}
		case *cnpgv1.Cluster:
			clusters++
			sync := o.Spec.PostgresConfiguration.Synchronous
			if sync == nil || sync.Number < 1 || sync.Number >= o.Spec.Instances {
				t.Errorf("Cluster %s: synchronous %+v with %d instances; want 1 <= standbys < instances", o.Name, sync, o.Spec.Instances)
			}
		}
	}
	if len(deployments) != 2 || jobs != 1 || services != 2 || len(pdbs) != 2 {
		t.Errorf("%d Deployments, %d Jobs, %d Services, %d PodDisruptionBudgets; want 2, 1, 2, 2", len(deployments), jobs, services, len(pdbs))
	}
	for _, p := range pdbs {
		sel := labels.SelectorFromSet(p.Spec.Selector.MatchLabels)
		n := 0
		for _, d := range deployments {
			if sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("PodDisruptionBudget %s selects %d Deployments' pods; want exactly 1", p.Name, n)
		}
	}
}

var graceArg = regexp.MustCompile(`^--shutdown-grace=(\d+)s$`)

func checkPod(t *testing.T, what string, pod *corev1.PodSpec, server bool) {
	t.Helper()
	sc := pod.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.SeccompProfile == nil ||
		sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: pod security context %+v; want runAsNonRoot and seccomp RuntimeDefault", what, sc)
	}
	secretVolumes := map[string]bool{}
	for _, v := range pod.Volumes {
		if v.Secret != nil {
			secretVolumes[v.Name] = true
		}
	}
	for _, c := range pod.Containers {
		cs := c.SecurityContext
		if cs == nil || cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem || cs.AllowPrivilegeEscalation == nil ||
			*cs.AllowPrivilegeEscalation || cs.Capabilities == nil || !slices.Equal(cs.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("%s/%s: security context %+v; want a read-only root, no privilege escalation, every capability dropped", what, c.Name, cs)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() ||
			c.Resources.Limits.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s/%s: resources %+v; want CPU and memory requests and limits", what, c.Name, c.Resources)
		}
		for _, m := range c.VolumeMounts {
			if secretVolumes[m.Name] && !m.ReadOnly {
				t.Errorf("%s/%s: secret volume %s mounted writable", what, c.Name, m.Name)
			}
		}
		for _, e := range c.Env {
			if e.Value != "" && !strings.HasSuffix(e.Name, "_FILE") {
				t.Errorf("%s/%s: environment variable %s set to a value; a secret belongs in a mounted file", what, c.Name, e.Name)
			}
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				t.Errorf("%s/%s: environment variable %s from a Secret; mount it as a file", what, c.Name, e.Name)
			}
		}
		if !server {
			continue
		}
		for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
			if p == nil || p.GRPC == nil || !slices.ContainsFunc(c.Args, func(a string) bool {
				return a == "--probe-listen=0.0.0.0:"+strconv.Itoa(int(p.GRPC.Port))
			}) {
				t.Errorf("%s/%s: %s probe %+v; want a gRPC probe on the --probe-listen port", what, c.Name, name, p)
			}
		}
		grace := -1
		for _, a := range c.Args {
			if m := graceArg.FindStringSubmatch(a); m != nil {
				grace, _ = strconv.Atoi(m[1])
			}
		}
		if grace < 0 || pod.TerminationGracePeriodSeconds == nil || *pod.TerminationGracePeriodSeconds <= int64(grace) {
			t.Errorf("%s/%s: terminationGracePeriodSeconds %v with --shutdown-grace %ds; want it longer", what, c.Name, pod.TerminationGracePeriodSeconds, grace)
		}
		if lp := c.LivenessProbe; lp != nil && int(lp.PeriodSeconds*lp.FailureThreshold) <= grace {
			t.Errorf("%s/%s: liveness fails after %ds, within the %ds drain (NOT_SERVING while draining): a restart mid-drain",
				what, c.Name, lp.PeriodSeconds*lp.FailureThreshold, grace)
		}
	}
}

// golden compares the rendered manifests with testdata/golden/NAME.yaml.
func golden(t *testing.T, name string, rendered map[string]string) {
	t.Helper()
	var b bytes.Buffer
	for _, f := range slices.Sorted(maps.Keys(rendered)) {
		if strings.TrimSpace(stripComments(rendered[f])) == "" {
			continue
		}
		fmt.Fprintf(&b, "# Source: %s\n%s\n---\n", f, strings.TrimSpace(rendered[f]))
	}
	path := filepath.Join("testdata", "golden", name+".yaml")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./... -update writes it)", err)
	}
	if !bytes.Equal(want, b.Bytes()) {
		t.Errorf("%s differs from the rendered manifests: review the change and run go test ./... -update", path)
	}
}

// TestChartAlertRulesAreTheProjects: the chart's PrometheusRule carries
// deploy/prometheus/fanout-rules.yaml unchanged.
func TestChartAlertRulesAreTheProjects(t *testing.T) {
	a, err := os.ReadFile(filepath.Join(chartDir, "files", "fanout-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join("prometheus", "fanout-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("helm/fanout/files/fanout-rules.yaml differs from prometheus/fanout-rules.yaml: copy it")
	}
}

// TestChartSchemaVersionIsTheBinarys: the chart's schema-version annotation,
// which decides whether an upgrade rolls or recreates the Deployments, is
// the highest versioned migration of this tree.
func TestChartSchemaVersionIsTheBinarys(t *testing.T) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("../migrations/versioned/[0-9][0-9][0-9][0-9]_*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no versioned migrations found (%v)", err)
	}
	latest, err := strconv.Atoi(filepath.Base(files[len(files)-1])[:4])
	if err != nil {
		t.Fatal(err)
	}
	if got := ch.Metadata.Annotations["fanout.dev/schema-version"]; got != strconv.Itoa(latest) {
		t.Errorf("Chart.yaml annotation fanout.dev/schema-version is %q; the migrations are at %d: update it", got, latest)
	}
}

// checkOrchestratorMemory: the orchestrator's memory limit leaves room for
// its request-bytes budget — twice --request-bytes (the requests it may
// hold, and as much again for the GC) and 192 MiB for everything else
// (docs/operations.md "Memory") — and GOMEMLIMIT holds the GC under that
// limit.
func checkOrchestratorMemory(t *testing.T, c corev1.Container) {
	t.Helper()
	var budget int64
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--request-bytes="); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("orchestrator arg %q: %v", a, err)
			}
			budget = n
		}
	}
	if budget == 0 {
		t.Fatalf("orchestrator args %q: no --request-bytes", c.Args)
	}
	floor := 2*budget + 192<<20
	if limit, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok || limit.Value() < floor {
		t.Errorf("orchestrator memory limit %v with --request-bytes=%d; want at least %d MiB (2 × --request-bytes + 192 MiB)",
			limit.String(), budget, floor>>20)
	}
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" && e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil &&
			e.ValueFrom.ResourceFieldRef.Resource == "limits.memory" {
			return
		}
	}
	t.Error("orchestrator: no GOMEMLIMIT from limits.memory")
}
