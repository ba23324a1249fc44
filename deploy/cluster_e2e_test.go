//go:build cluster

package deploy_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fanout/fanout/peer"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store/pglocal"
)

// The image `make image` built: its OCI archive, its tag and the static
// binary in it (the test runs it on the host as an operator's CLI).
const (
	imageArchive = "../.tmp/image/fanout.oci.tar"
	imageBinary  = "../.tmp/image/fanout"
	imageRef     = "localhost/fanout:dev"
)

// TestClusterNode is tier 3: the chart installed with Helm on a real node
// (kubelet, containerd, runc, the bridge CNI, a cluster DNS) running the
// image of `make image`, pinned by digest. The migrate hook Job migrates a
// PostgreSQL the test started, reached through a selector-less headless
// Service (the chart's "external database"); each process logs in as its
// own role. A run fans out across the worker pods found through the
// headless Service; a rollout restart of the workers in the middle of a
// run loses no task; a worker pod killed in the middle of a run has its
// tasks dispatched again; every run's ledger is conserved.
func TestClusterNode(t *testing.T) {
	requireNodeTools(t)
	for _, f := range []string{imageArchive, imageBinary} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("%v: run `make image` first (make k8s-e2e does)", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	cp := startControlPlane(t, ctx)
	makePodBridge(t)
	cp.serveClusterDNS(t, ctx)
	n := cp.startNode(t, ctx, mustAbs(t, imageArchive))
	digest := n.imageDigest(t, imageRef)
	cp.createNamespace(t, ctx, releaseNamespace)

	// The "external" database: PostgreSQL on the host, reached from the
	// pods at postgres.fanout.svc.cluster.local through a headless Service
	// without a selector whose EndpointSlice names the host.
	pgDir := t.TempDir()
	for _, d := range []string{filepath.Dir(pgDir), pgDir} {
		if err := os.Chmod(d, 0o711); err != nil { // postgres runs as its own user
			t.Fatal(err)
		}
	}
	// Durable (not pglocal's Fast): the chart's nodes refuse a database
	// that can lose an acknowledged grant, as they would in production.
	pg, err := pglocal.Start(ctx, pglocal.Config{DataDir: filepath.Join(pgDir, "pg")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Stop(context.Background()) })
	tcpProxy(t, hostOnPods+":5432", "127.0.0.1:"+strconv.Itoa(pg.Port()))
	cp.externalDatabaseService(t, ctx)
	owner := prepareDatabase(t, ctx, pg)
	const pgHost = "postgres." + releaseNamespace + ".svc.cluster.local:5432"
	cp.createSecret(t, ctx, "fanout-db-owner", map[string]string{"url": "postgres://postgres@" + pgHost + "/fanout?sslmode=disable"})
	cp.createSecret(t, ctx, "fanout-db-orchestrator", map[string]string{"url": "postgres://k8s_orchestrator:orchestrator-pw@" + pgHost + "/fanout?sslmode=disable"})
	cp.createSecret(t, ctx, "fanout-db-worker", map[string]string{"url": "postgres://k8s_worker:worker-pw@" + pgHost + "/fanout?sslmode=disable"})
	cp.createSecret(t, ctx, "fanout-db-admin", map[string]string{"url": "postgres://k8s_admin:admin-pw@" + pgHost + "/fanout?sslmode=disable"})
	cp.createPeerSecrets(t, ctx)

	rel := cp.helmInstall(t, ctx, nodeValues(digest))
	for _, h := range rel.Hooks {
		t.Logf("hook %s %s: %s", h.Kind, h.Name, h.LastRun.Phase)
	}
	orchestrators := cp.readyPods(t, ctx, "app.kubernetes.io/component=orchestrator", 2)
	workers := cp.readyPods(t, ctx, "app.kubernetes.io/component=worker", 2)
	for _, p := range append(orchestrators, workers...) {
		if img := p.Spec.Containers[0].Image; img != "localhost/fanout@"+digest {
			t.Errorf("pod %s runs %s, want the image of make image by digest %s", p.Name, img, digest)
		}
	}
	var version int
	if err := owner.QueryRow(ctx, `SELECT max(version) FROM public.schema_migration`).Scan(&version); err != nil {
		t.Fatalf("the migrate hook did not migrate the database: %v", err)
	}
	t.Logf("schema version %d, migrated by the hook Job", version)

	key := createKey(t, ctx, pg.URL("fanout"), "--tenant", "k8s", "--scopes", "run,read")
	dial := func(key string) *grpc.ClientConn {
		pods := cp.readyPods(t, ctx, "app.kubernetes.io/component=orchestrator", 2)
		conn, err := grpc.NewClient(pods[0].Status.PodIP+":50051",
			grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer(key)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	call := func() fanoutv1.OrchestratorServiceClient { return fanoutv1.NewOrchestratorServiceClient(dial(key)) }

	t.Run("AdminServiceOnItsOwnLogin", func(t *testing.T) {
		admin := fanoutv1.NewAdminServiceClient(dial(createKey(t, ctx, pg.URL("fanout"), "--admin")))
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if _, err := admin.GetTenant(rctx, &fanoutv1.GetTenantRequest{TenantId: "k8s"}); err != nil {
			t.Fatalf("AdminService.GetTenant through an orchestrator pod (--admin-database-url-file): %v", err)
		}
	})

	t.Run("FanOutReachesEveryWorkerPod", func(t *testing.T) {
		// A third worker joins the headless Service after the orchestrators
		// resolved it. They use it once a connection ends (its worker's
		// --max-connection-age, 3s here, ±10%) and gRPC's DNS resolver, which
		// resolves at most every 30 s, has resolved again.
		cp.scale(t, ctx, "fanout-worker", 3)
		pods := podNames(cp.readyPods(t, ctx, "app.kubernetes.io/component=worker", 3))
		joined := time.Now()
		seen := map[string]bool{}
		for i := 0; ; i++ {
			runID := startRun(t, ctx, call(), "k8s-fan-out-"+strconv.Itoa(i), 16)
			waitRun(t, ctx, owner, runID)
			checkRun(t, ctx, owner, runID, 16)
			for _, w := range workersOf(t, ctx, owner, runID) {
				seen[w] = true
			}
			if len(seen) == len(pods) && seen[pods[0]] && seen[pods[1]] && seen[pods[2]] {
				t.Logf("every worker pod ran tasks, the new one %s after it was ready (%d runs)", time.Since(joined).Round(100*time.Millisecond), i+1)
				break
			}
			if time.Since(joined) > 30*time.Second+3*time.Second*11/10+10*time.Second {
				t.Fatalf("after %s and %d runs tasks ran on %v; the ready workers are %v", time.Since(joined), i+1, keys(seen), pods)
			}
		}
	})

	t.Run("RolloutRestartOfTheWorkers", func(t *testing.T) {
		before := podNames(cp.readyPods(t, ctx, "app.kubernetes.io/component=worker", 3))
		runID := startRun(t, ctx, call(), "k8s-rollout", 64)
		waitTasks(t, ctx, owner, runID, 6)
		cp.rolloutRestart(t, ctx, "fanout-worker")
		waitRun(t, ctx, owner, runID)
		checkRun(t, ctx, owner, runID, 64)
		ran := workersOf(t, ctx, owner, runID)
		now := podNames(cp.readyPods(t, ctx, "app.kubernetes.io/component=worker", 3))
		if !overlaps(ran, now) || !overlaps(ran, before) {
			t.Errorf("tasks ran on %v; the workers before the restart were %v, after %v: the run did not span the restart", ran, before, now)
		}
		t.Logf("64 tasks, all SUCCEEDED on %d worker pods across the restart; %d sent again after a draining worker refused them", len(ran), resent(t, ctx, owner, runID))
	})

	t.Run("WorkerPodDeleted", func(t *testing.T) {
		before := cp.readyPods(t, ctx, "app.kubernetes.io/component=worker", 3)
		runID := startRun(t, ctx, call(), "k8s-delete", 48)
		victim := before[0].Name
		var inFlight []string
		poll(t, ctx, time.Minute, "a task of the run running on "+victim, func() (bool, error) {
			rows, err := owner.Query(ctx, `SELECT task_id FROM fanout.task WHERE run_id = $1 AND status = 'RUNNING' AND worker = $2`, runID, victim)
			if err != nil {
				return false, err
			}
			inFlight, err = pgx.CollectRows(rows, pgx.RowTo[string])
			return len(inFlight) > 0, err
		})
		// kubectl delete pod: SIGTERM, the worker drains (finishes what it
		// runs, refuses what comes), the ReplicaSet replaces it. A task takes
		// about 2 s (5 model calls of 400 ms), so what ran at the delete still
		// runs when the kubelet's SIGTERM arrives.
		if err := cp.cs.CoreV1().Pods(releaseNamespace).Delete(ctx, victim, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		var deleted time.Time
		if err := owner.QueryRow(ctx, `SELECT now()`).Scan(&deleted); err != nil {
			t.Fatal(err)
		}
		waitRun(t, ctx, owner, runID)
		checkRun(t, ctx, owner, runID, 48)
		var drained, after int
		if err := owner.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE finished_at > $4) FROM fanout.task
			WHERE run_id = $1 AND task_id = ANY($2) AND worker = $3 AND status = 'SUCCEEDED'`,
			runID, inFlight, victim, deleted).Scan(&drained, &after); err != nil {
			t.Fatal(err)
		}
		if drained != len(inFlight) {
			t.Errorf("%d of the %d tasks %s ran when it was deleted finished there", drained, len(inFlight), victim)
		}
		if after == 0 {
			t.Errorf("none of the tasks %s ran finished after it was deleted: the drain was not exercised", victim)
		}
		t.Logf("48 tasks SUCCEEDED; %d in flight on the deleted pod finished there (%d after the delete); %d sent again after it refused them", len(inFlight), after, resent(t, ctx, owner, runID))
	})
}

// resent is how many times the run's tasks were sent to a worker again
// after one refused them or could not be reached before it started them
// (each try is a new attempt of the task's ledger account).
func resent(t *testing.T, ctx context.Context, db *pgx.Conn, runID string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(ctx, `SELECT coalesce(sum(attempt - 1), 0) FROM fanout.account WHERE run_id = $1 AND kind = 'task' AND attempt > 1`,
		runID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (cp *controlPlane) scale(t *testing.T, ctx context.Context, deployment string, replicas int) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	if _, err := cp.cs.AppsV1().Deployments(releaseNamespace).Patch(ctx, deployment, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func keys(m map[string]bool) []string {
	return slices.Sorted(maps.Keys(m))
}

// externalDatabaseService makes Service postgres: headless, no selector,
// and an EndpointSlice naming the host's address on the pod bridge.
func (cp *controlPlane) externalDatabaseService(t *testing.T, ctx context.Context) {
	t.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "postgres"},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Name: "postgres", Port: 5432}}}}
	if _, err := cp.cs.CoreV1().Services(releaseNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	port, proto, ready := int32(5432), corev1.ProtocolTCP, true
	name := "postgres"
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "postgres-host", Labels: map[string]string{discoveryv1.LabelServiceName: "postgres", discoveryv1.LabelManagedBy: "fanout-test"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{hostOnPods}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}
	if _, err := cp.cs.DiscoveryV1().EndpointSlices(releaseNamespace).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// prepareDatabase makes what a database administrator makes before the
// first install (docs/kubernetes.md "Who makes the database logins"): the
// database, and a login in each group the processes use. It returns a
// connection as the owner (the cluster's superuser here).
func prepareDatabase(t *testing.T, ctx context.Context, pg *pglocal.Server) *pgx.Conn {
	t.Helper()
	admin, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `CREATE DATABASE fanout`); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`CREATE ROLE fanout_app NOLOGIN`,
		`CREATE ROLE fanout_worker NOLOGIN`,
		`CREATE ROLE k8s_orchestrator LOGIN PASSWORD 'orchestrator-pw' IN ROLE fanout_app`,
		`CREATE ROLE k8s_worker LOGIN PASSWORD 'worker-pw' IN ROLE fanout_worker`,
		`CREATE ROLE fanout_admin NOLOGIN`,
		`CREATE ROLE k8s_admin LOGIN PASSWORD 'admin-pw' IN ROLE fanout_admin`,
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	owner, err := pgx.Connect(ctx, pg.URL("fanout"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Close(context.Background()) })
	return owner
}

// createPeerSecrets makes the peer trust material (mutual TLS, the signing
// key and its public key) and the chart's three Secrets of it.
func (cp *controlPlane) createPeerSecrets(t *testing.T, ctx context.Context) {
	t.Helper()
	files, err := peer.GenerateDev(filepath.Join(t.TempDir(), "peer"))
	if err != nil {
		t.Fatal(err)
	}
	read := func(p string) string { return string(readFile(t, p)) + "\n" }
	cp.createSecret(t, ctx, "fanout-peer-orchestrator", map[string]string{
		"ca.crt": read(files.CA), "tls.crt": read(files.Orchestrator.Cert), "tls.key": read(files.Orchestrator.Key),
		"signing.key": read(files.SigningKey)})
	cp.createSecret(t, ctx, "fanout-peer-worker", map[string]string{
		"ca.crt": read(files.CA), "tls.crt": read(files.Worker.Cert), "tls.key": read(files.Worker.Key)})
	cp.createSecret(t, ctx, "fanout-peer-verify-keys", map[string]string{"orchestrator.pem": read(files.VerifyKey)})
}

// createKey makes a tenant and an API key with the host's fanout binary as
// the schema's owner, as an operator makes a fleet's first ones.
func createKey(t *testing.T, ctx context.Context, ownerURL string, keyArgs ...string) string {
	t.Helper()
	run := func(args ...string) string {
		out, err := exec.CommandContext(ctx, imageBinary, append(args, "--database-url", ownerURL)...).Output()
		if err != nil {
			t.Fatalf("fanout %s: %v", strings.Join(args[:2], " "), err)
		}
		return string(out)
	}
	var exists int
	if err := pgxQueryRow(ctx, ownerURL, `SELECT count(*) FROM fanout.tenant WHERE tenant_id = 'k8s'`, &exists); err != nil {
		t.Fatal(err)
	}
	if exists == 0 {
		run("tenant", "create", "k8s")
	}
	fields := strings.Fields(run(append([]string{"key", "create", "--name", "k8s-e2e"}, keyArgs...)...))
	if len(fields) == 0 || !strings.HasPrefix(fields[len(fields)-1], "fanout_fk_") {
		t.Fatal("fanout key create printed no token")
	}
	return fields[len(fields)-1]
}

// bearer sends an API key as `authorization: Bearer <token>`.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

// startRun starts a run of n independent tasks on the sim model, four at a
// time, with a budget none of them reaches.
func startRun(t *testing.T, ctx context.Context, c fanoutv1.OrchestratorServiceClient, key string, n int) string {
	t.Helper()
	s := &fanoutv1.RunSpec{
		IdempotencyKey: key, TenantId: "k8s", Goal: "find facts",
		Budget: &fanoutv1.Budget{LimitTokens: 5_000_000, MinReservationTokens: 300},
		Limits: &fanoutv1.Limits{MaxConcurrency: 4},
		Model:  &fanoutv1.ModelSettings{Provider: "sim", MaxOutputTokens: 200, Seed: 7},
	}
	for i := range n {
		s.Tasks = append(s.Tasks, &fanoutv1.TaskSpec{
			Id: fmt.Sprintf("t%02d", i), Instruction: fmt.Sprintf("look up item %d", i),
			TokenBudget: 50_000, MaxIterations: 5, AllowedTools: []string{"search"},
		})
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r, err := c.StartRun(rctx, &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatalf("StartRun: %v", err)
	}
	return r.GetRunId()
}

// waitTasks waits until at least n of the run's tasks have succeeded.
func waitTasks(t *testing.T, ctx context.Context, db *pgx.Conn, runID string, n int) {
	t.Helper()
	poll(t, ctx, 2*time.Minute, fmt.Sprintf("%d tasks of run %s done", n, runID), func() (bool, error) {
		var done int
		err := db.QueryRow(ctx, `SELECT count(*) FROM fanout.task WHERE run_id = $1 AND status = 'SUCCEEDED'`, runID).Scan(&done)
		return done >= n, err
	})
}

// waitRun waits until the run has ended.
func waitRun(t *testing.T, ctx context.Context, db *pgx.Conn, runID string) {
	t.Helper()
	poll(t, ctx, 4*time.Minute, "run "+runID+" ended", func() (bool, error) {
		var state string
		err := db.QueryRow(ctx, `SELECT state FROM fanout.run WHERE run_id = $1`, runID).Scan(&state)
		return state != "" && state != "RUNNING" && state != "PENDING", err
	})
}

// checkRun checks that the run succeeded with every one of its n tasks,
// that its ledger is conserved with nothing left reserved or held (no open
// reservation), and that it spent within its limit.
func checkRun(t *testing.T, ctx context.Context, db *pgx.Conn, runID string, n int) {
	t.Helper()
	var state string
	var succeeded int
	if err := db.QueryRow(ctx, `SELECT r.state, (SELECT count(*) FROM fanout.task k WHERE k.run_id = r.run_id AND k.status = 'SUCCEEDED')
		FROM fanout.run r WHERE r.run_id = $1`, runID).Scan(&state, &succeeded); err != nil {
		t.Fatal(err)
	}
	if state != "SUCCEEDED" || succeeded != n {
		t.Errorf("run %s: %s with %d of %d tasks succeeded", runID, state, succeeded, n)
		rows, err := db.Query(ctx, `SELECT task_id || ' ' || status || ' on ' || worker || ': ' || coalesce(outcome_error, '')
			FROM fanout.task WHERE run_id = $1 AND status <> 'SUCCEEDED'`, runID)
		if err == nil {
			failed, _ := pgx.CollectRows(rows, pgx.RowTo[string])
			t.Errorf("the tasks that did not succeed: %q", failed)
		}
	}
	var accounts int
	var conserved bool
	if err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE run_id = $1), coalesce(bool_and(conserved), false) FROM fanout.conservation_check`,
		runID).Scan(&accounts, &conserved); err != nil {
		t.Fatal(err)
	}
	if accounts == 0 || !conserved {
		t.Errorf("run %s: conservation_check over %d of its accounts: conserved=%v", runID, accounts, conserved)
	}
	var spent, limit, reserved, held, open int64
	if err := db.QueryRow(ctx, `SELECT spent_tokens, limit_tokens, reserved_tokens, held_tokens,
		(SELECT count(*) FROM fanout.open_reservations o WHERE o.run_id = s.run_id)
		FROM fanout.run_spend s WHERE run_id = $1`, runID).Scan(&spent, &limit, &reserved, &held, &open); err != nil {
		t.Fatal(err)
	}
	if spent > limit || reserved != 0 || held != 0 || open != 0 {
		t.Errorf("run %s: spent %d of %d; %d still reserved in %d open reservations, %d held", runID, spent, limit, reserved, open, held)
	}
}

// workersOf returns the worker pods that ran the run's tasks.
func workersOf(t *testing.T, ctx context.Context, db *pgx.Conn, runID string) []string {
	t.Helper()
	rows, err := db.Query(ctx, `SELECT DISTINCT worker FROM fanout.task WHERE run_id = $1 ORDER BY 1`, runID)
	if err != nil {
		t.Fatal(err)
	}
	w, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// rolloutRestart does what `kubectl rollout restart` does: a new pod
// template annotation, so the Deployment rolls every pod.
func (cp *controlPlane) rolloutRestart(t *testing.T, ctx context.Context, deployment string) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339))
	if _, err := cp.cs.AppsV1().Deployments(releaseNamespace).Patch(ctx, deployment, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func overlaps(a, b []string) bool {
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return true
			}
		}
	}
	return false
}

func pgxQueryRow(ctx context.Context, url, sql string, dest ...any) error {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	return c.QueryRow(ctx, sql).Scan(dest...)
}
