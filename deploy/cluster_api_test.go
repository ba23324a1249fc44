//go:build cluster

package deploy_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	chartv2 "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// The operators' module zips that ship the CRDs the chart's optional objects need.
const (
	cnpgModule       = "github.com/cloudnative-pg/cloudnative-pg@v1.30.0"
	promOpModule     = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
	releaseNamespace = "fanout"
)

// TestClusterAPIServer is tier 2: every value set's manifests pass the real
// API server's server-side apply with strict field validation (the
// CloudNativePG and Prometheus operator CRDs installed), a misspelled field
// is refused, and the chart installed with Helm on kwok's fake nodes comes
// up: the migrate hook Job completes, the Deployments become Available, the
// headless worker Service lists every worker, and an eviction past a
// PodDisruptionBudget is refused. An upgrade rolls a Deployment whose pods
// run this schema version and recreates one whose pods run another.
func TestClusterAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cp := startControlPlane(t, ctx)
	cp.installCRDs(t, ctx,
		filepath.Join(modDir(t, cnpgModule), "config/crd/bases/postgresql.cnpg.io_clusters.yaml"),
		filepath.Join(modDir(t, promOpModule), "example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml"),
		filepath.Join(modDir(t, promOpModule), "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml"))
	cp.createNamespace(t, ctx, releaseNamespace)

	t.Run("StrictDryRun", func(t *testing.T) {
		for _, vs := range valueSets {
			rendered := render(t, vs.values)
			n := 0
			for _, name := range slices.Sorted(maps.Keys(rendered)) {
				for _, doc := range documents(rendered[name]) {
					if err := cp.apply(ctx, doc, true); err != nil {
						t.Errorf("%s: %s: %v", vs.name, name, err)
					}
					n++
				}
			}
			t.Logf("%s: %d objects accepted by server-side apply (dryRun=All, fieldValidation=Strict)", vs.name, n)
		}
		// The same path refuses a mistake the chart could make.
		bad := strings.Replace(documents(render(t, minimalValues)["fanout/templates/worker.yaml"])[0], "readinessProbe:", "readynessProbe:", 1)
		err := cp.apply(ctx, bad, true)
		if err == nil || !strings.Contains(err.Error(), "readynessProbe") {
			t.Errorf("a misspelled field: got %v, want a strict-validation error naming readynessProbe", err)
		}
	})

	// kwok makes the nodes it manages Ready, their pods Running and Ready,
	// and Job pods Succeeded; no container runs.
	cp.run(t, "kwok", filepath.Join(cp.bin, "kwok"),
		"--kubeconfig="+cp.kubeconfig,
		"--config="+mustAbs(t, "testdata/kwok/stages.yaml"),
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
		"--node-lease-duration-seconds=40",
		"--server-address=127.0.0.1:0")
	installed := t.Run("InstallOnKwokNodes", func(t *testing.T) {
		for i := range 3 {
			cp.createKwokNode(t, ctx, fmt.Sprintf("kwok-node-%d", i))
		}
		for _, s := range []string{"fanout-db-owner", "fanout-db-orchestrator", "fanout-db-worker"} {
			cp.createSecret(t, ctx, s, map[string]string{"url": "postgres://unused@postgres.invalid/fanout"})
		}
		cp.createSecret(t, ctx, "fanout-peer-orchestrator", map[string]string{"ca.crt": "-", "tls.crt": "-", "tls.key": "-", "signing.key": "-"})
		cp.createSecret(t, ctx, "fanout-peer-worker", map[string]string{"ca.crt": "-", "tls.crt": "-", "tls.key": "-"})
		cp.createSecret(t, ctx, "fanout-peer-verify-keys", map[string]string{"a.pem": "-"})
		cp.createSecret(t, ctx, "fanout-callers-tls", map[string]string{"tls.crt": "-", "tls.key": "-"})

		rel := cp.helmInstall(t, ctx, valuesMap(t, minimalValues))
		for _, h := range rel.Hooks {
			if h.LastRun.Phase != releasev1.HookPhaseSucceeded {
				t.Errorf("hook %s %s: %s", h.Kind, h.Name, h.LastRun.Phase)
			}
		}
		if len(rel.Hooks) == 0 {
			t.Error("the release ran no hook: the migrate Job should be a pre-install hook")
		}

		workers := cp.readyPods(t, ctx, "app.kubernetes.io/component=worker", 3)
		svc, err := cp.cs.CoreV1().Services(releaseNamespace).Get(ctx, "fanout-worker", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("worker Service: clusterIP %q, want None (headless)", svc.Spec.ClusterIP)
		}
		poll(t, ctx, time.Minute, "the worker EndpointSlices list every worker", func() (bool, error) {
			return slices.Equal(cp.endpointPods(t, ctx, "fanout-worker"), podNames(workers)), nil
		})
		cp.readyPods(t, ctx, "app.kubernetes.io/component=orchestrator", 2)

		// A drain evicts; the PDB (maxUnavailable 1) lets one worker go and
		// refuses the second until the first is replaced and ready.
		if err := cp.evict(ctx, workers[0].Name); err != nil {
			t.Fatalf("first eviction: %v", err)
		}
		err = cp.evict(ctx, workers[1].Name)
		if !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "disruption budget") {
			t.Fatalf("second eviction while one worker is down: got %v, want 429 naming the disruption budget", err)
		}
		cp.readyPods(t, ctx, "app.kubernetes.io/component=worker", 3)
		poll(t, ctx, time.Minute, "the second eviction, once the first worker is replaced", func() (bool, error) {
			err := cp.evict(ctx, workers[1].Name)
			if apierrors.IsTooManyRequests(err) {
				return false, err
			}
			return err == nil, err
		})
	})

	if !installed {
		return
	}
	t.Run("UpgradeRecreatesAcrossSchemaVersions", func(t *testing.T) {
		// The same schema: rolled.
		cp.helmUpgrade(t, ctx, valuesMap(t, minimalValues))
		for _, d := range []string{"fanout-orchestrator", "fanout-worker"} {
			if s := cp.strategy(t, ctx, d); s != appsv1.RollingUpdateDeploymentStrategyType {
				t.Errorf("%s after an upgrade within one schema version: %s, want RollingUpdate", d, s)
			}
		}
		// The workers run the previous schema version: recreated; the
		// orchestrators, already on this one, rolled.
		patch := `{"spec":{"template":{"metadata":{"annotations":{"fanout.dev/schema-version":"26"}}}}}`
		if _, err := cp.cs.AppsV1().Deployments(releaseNamespace).Patch(ctx, "fanout-worker", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		cp.rolledOut(t, ctx, "fanout-worker")
		cp.helmUpgrade(t, ctx, valuesMap(t, minimalValues))
		if s := cp.strategy(t, ctx, "fanout-worker"); s != appsv1.RecreateDeploymentStrategyType {
			t.Errorf("fanout-worker upgraded from schema 26: %s, want Recreate", s)
		}
		if s := cp.strategy(t, ctx, "fanout-orchestrator"); s != appsv1.RollingUpdateDeploymentStrategyType {
			t.Errorf("fanout-orchestrator upgraded within its schema version: %s, want RollingUpdate", s)
		}
		cp.readyPods(t, ctx, "app.kubernetes.io/component=worker", 3)
	})
}

// installCRDs creates each CRD file and waits until it is Established.
func (cp *controlPlane) installCRDs(t *testing.T, ctx context.Context, files ...string) {
	t.Helper()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range documents(string(b)) {
			if err := cp.apply(ctx, doc, false); err != nil {
				t.Fatalf("CRD %s: %v", filepath.Base(f), err)
			}
		}
	}
	cp.mapper().Reset()
}

// apply server-side applies one manifest with strict field validation,
// dry-run if dryRun. Custom kinds wait for their CRD to be served.
func (cp *controlPlane) apply(ctx context.Context, doc string, dryRun bool) error {
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
		return err
	}
	gvk := obj.GroupVersionKind()
	var mapping *restMapping
	deadline := time.Now().Add(30 * time.Second)
	for {
		m, err := cp.mapper().RESTMapping(gvk.GroupKind(), gvk.Version)
		if err == nil {
			mapping = &restMapping{m.Resource, m.Scope.Name() == "namespace"}
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %w", gvk, err)
		}
		cp.mapper().Reset()
		time.Sleep(200 * time.Millisecond) // a new CRD is served within a second
	}
	dyn, err := dynamic.NewForConfig(cp.cfg)
	if err != nil {
		return err
	}
	js, err := obj.MarshalJSON()
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{FieldManager: "fanout-chart-test", FieldValidation: "Strict", Force: new(true)}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	var ri dynamic.ResourceInterface = dyn.Resource(mapping.gvr)
	if mapping.namespaced {
		ri = dyn.Resource(mapping.gvr).Namespace(releaseNamespace)
	}
	_, err = ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, js, opts)
	if err != nil {
		return fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	return nil
}

type restMapping struct {
	gvr        schema.GroupVersionResource
	namespaced bool
}

func (cp *controlPlane) mapper() *restmapper.DeferredDiscoveryRESTMapper {
	if cp.restMapper == nil {
		dc := discovery.NewDiscoveryClientForConfigOrDie(cp.cfg)
		cp.restMapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	}
	return cp.restMapper
}

func (cp *controlPlane) createNamespace(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if _, err := cp.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, time.Minute, "the service account of namespace "+name, func() (bool, error) {
		_, err := cp.cs.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
}

func (cp *controlPlane) createSecret(t *testing.T, ctx context.Context, name string, data map[string]string) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: data}
	if _, err := cp.cs.CoreV1().Secrets(releaseNamespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// createKwokNode registers a fake node that kwok keeps Ready.
func (cp *controlPlane) createKwokNode(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("32"), corev1.ResourceMemory: resource.MustParse("256Gi"), corev1.ResourcePods: resource.MustParse("110")}
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name,
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
			Labels:      map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "type": "kwok"}},
		Status: corev1.NodeStatus{Allocatable: res, Capacity: res},
	}
	if _, err := cp.cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// helmInstall installs the chart as release "fanout" in the release
// namespace with the values over its defaults, waiting (hooks included)
// until every resource is ready.
func (cp *controlPlane) helmInstall(t *testing.T, ctx context.Context, vals map[string]any) *releasev1.Release {
	t.Helper()
	ch, cfg := cp.helm(t)
	install := action.NewInstall(cfg)
	install.ReleaseName = "fanout"
	install.Namespace = releaseNamespace
	install.WaitStrategy = kube.StatusWatcherStrategy
	install.WaitForJobs = true
	install.Timeout = 4 * time.Minute
	install.ServerSideApply = true
	r, err := install.RunWithContext(ctx, ch, vals)
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	rel, ok := r.(*releasev1.Release)
	if !ok {
		t.Fatalf("helm install returned a %T", r)
	}
	return rel
}

// helmUpgrade upgrades release "fanout" to the chart with the values over
// its defaults, waiting until every resource is ready.
func (cp *controlPlane) helmUpgrade(t *testing.T, ctx context.Context, vals map[string]any) {
	t.Helper()
	ch, cfg := cp.helm(t)
	upgrade := action.NewUpgrade(cfg)
	upgrade.Namespace = releaseNamespace
	upgrade.WaitStrategy = kube.StatusWatcherStrategy
	upgrade.WaitForJobs = true
	upgrade.Timeout = 4 * time.Minute
	upgrade.ServerSideApply = "true"
	upgrade.ForceConflicts = true
	if _, err := upgrade.RunWithContext(ctx, "fanout", ch, vals); err != nil {
		t.Fatalf("helm upgrade: %v", err)
	}
}

// helm loads the chart and a Helm configuration for the release namespace.
func (cp *controlPlane) helm(t *testing.T) (*chartv2.Chart, *action.Configuration) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &cp.kubeconfig
	ns := releaseNamespace
	flags.Namespace = &ns
	cfg := action.NewConfiguration()
	if err := cfg.Init(flags, releaseNamespace, "secret"); err != nil {
		t.Fatal(err)
	}
	return ch, cfg
}

// rolledOut waits until the Deployment's controller has seen its latest
// spec and every replica is updated and available, as kubectl rollout
// status does.
func (cp *controlPlane) rolledOut(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	poll(t, ctx, 2*time.Minute, "deployment "+name+" rolled out", func() (bool, error) {
		d, err := cp.cs.AppsV1().Deployments(releaseNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		want := *d.Spec.Replicas
		st := d.Status
		return st.ObservedGeneration >= d.Generation && st.UpdatedReplicas == want && st.Replicas == want &&
			st.AvailableReplicas == want, nil
	})
}

// strategy returns a Deployment's update strategy type.
func (cp *controlPlane) strategy(t *testing.T, ctx context.Context, name string) appsv1.DeploymentStrategyType {
	t.Helper()
	d, err := cp.cs.AppsV1().Deployments(releaseNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d.Spec.Strategy.Type
}

// readyPods waits until exactly n pods match the selector, all Ready and
// none terminating, and returns them sorted by name.
func (cp *controlPlane) readyPods(t *testing.T, ctx context.Context, selector string, n int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	poll(t, ctx, 2*time.Minute, fmt.Sprintf("%d ready pods %s", n, selector), func() (bool, error) {
		list, err := cp.cs.CoreV1().Pods(releaseNamespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err
		}
		pods = pods[:0]
		for _, p := range list.Items {
			if p.DeletionTimestamp != nil {
				return false, nil
			}
			if !podReady(&p) {
				return false, fmt.Errorf("%s not ready: %s", p.Name, p.Status.Phase)
			}
			pods = append(pods, p)
		}
		return len(pods) == n, nil
	})
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return pods
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podNames(pods []corev1.Pod) []string {
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	return names
}

// endpointPods returns the sorted names of the ready pods the Service's
// EndpointSlices list.
func (cp *controlPlane) endpointPods(t *testing.T, ctx context.Context, service string) []string {
	t.Helper()
	slices_, err := cp.cs.DiscoveryV1().EndpointSlices(releaseNamespace).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + service})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range slices_.Items {
		for _, e := range s.Endpoints {
			if e.TargetRef != nil && (e.Conditions.Ready == nil || *e.Conditions.Ready) {
				names = append(names, e.TargetRef.Name)
			}
		}
	}
	slices.Sort(names)
	return names
}

// evict asks the eviction API to evict a pod, as kubectl drain does.
func (cp *controlPlane) evict(ctx context.Context, pod string) error {
	return cp.cs.PolicyV1().Evictions(releaseNamespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: releaseNamespace}})
}

// documents splits a rendered template into its non-empty YAML documents.
func documents(rendered string) []string {
	var docs []string
	for _, doc := range strings.Split(rendered, "\n---") {
		if strings.TrimSpace(stripComments(doc)) != "" {
			docs = append(docs, doc)
		}
	}
	return docs
}

func mustAbs(t *testing.T, path string) string {
	t.Helper()
	p, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
