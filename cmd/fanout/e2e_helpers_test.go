package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/fanout/fanout/orchestrator"
	"github.com/fanout/fanout/peer"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent/llm"
)

// envE2EArgs, when set in the environment of a re-executed test binary,
// makes it run Main with these arguments (a JSON array) instead of the
// tests: that is how the tests start real `fanout worker` processes.
const envE2EArgs = "FANOUT_E2E_ARGS"

// envUnsafeDurability is --allow-unsafe-durability's variable.
const envUnsafeDurability = "FANOUT_ALLOW_UNSAFE_DURABILITY"

// testGetenv is the environment of a server run in this process: only
// envUnsafeDurability (TestMain sets it) of this process's own.
func testGetenv(k string) string {
	if k == envUnsafeDurability {
		return os.Getenv(k)
	}
	return ""
}

func TestMain(m *testing.M) {
	if raw := os.Getenv(envE2EArgs); raw != "" {
		os.Exit(childMain(raw))
	}
	if os.Getenv(envMCPShim) != "" {
		os.Exit(mcpShimMain())
	}
	// The test clusters run with fsync, synchronous_commit and
	// full_page_writes off (pglocal.Config.Fast): every node started here,
	// in this process or a child, accepts that, unless a test's own
	// environment for a child says otherwise (the failover tier's does).
	if os.Getenv(envUnsafeDurability) == "" {
		_ = os.Setenv(envUnsafeDurability, "1")
	}
	storetest.MigrateFunc = store.Migrate
	storetest.Main(m)
	if err := goleak.Find(); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
		os.Exit(1)
	}
}

// childMain is the re-executed binary's main: Main under a context that
// SIGTERM and Ctrl-C cancel, as in the real binary.
func childMain(raw string) int {
	var args []string
	if err := json.Unmarshal([]byte(raw), &args); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", envE2EArgs, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Main(ctx, args, os.Stdout, os.Stderr, os.Getenv)
}

// logTail keeps a process's log lines and reports the address it announced.
type logTail struct {
	mu    sync.Mutex
	lines []string
}

func (l *logTail) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, s)
}

// all returns every line kept, in order.
func (l *logTail) all() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := l.lines
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}

// scanLog reads JSON log lines from r until EOF, keeping them in tail, and
// sends the "addr" of the first line whose msg is serving on addr.
func scanLog(r io.Reader, tail *logTail, serving string, addr chan<- string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	sent := false
	for sc.Scan() {
		line := sc.Text()
		tail.add(line)
		if sent {
			continue
		}
		var rec struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == serving && rec.Addr != "" {
			addr <- rec.Addr
			sent = true
		}
	}
	_, _ = io.Copy(io.Discard, r) // a line too long for the scanner must not block the writer
}

// workerProc is a `fanout worker` running as a child process (this test
// binary, re-executed).
type workerProc struct {
	name   string
	addr   string
	simLog string
	cmd    *exec.Cmd
	logs   *logTail      // its stderr, every line
	stdout *lockedBuffer // its stdout
	exited chan struct{} // closed once the process was waited for
}

// lockedBuffer is a bytes.Buffer safe for a writer and readers in other
// goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var (
	testPeerOnce  sync.Once
	testPeerFiles peer.DevFiles
	testPeerErr   error
)

// testPeer returns the CA, certificates and signing key every node of the
// tests uses, made once per test binary as `fanout dev` makes them.
func testPeer(t testing.TB) peer.DevFiles {
	t.Helper()
	testPeerOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fanout-peer-")
		if err != nil {
			testPeerErr = err
			return
		}
		testPeerFiles, testPeerErr = peer.GenerateDev(dir)
	})
	if testPeerErr != nil {
		t.Fatalf("generate peer credentials: %v", testPeerErr)
	}
	return testPeerFiles
}

// startWorkerProc starts a worker process on a loopback port of its choice
// against databaseURL and waits until it serves. extra are more flags.
func startWorkerProc(t testing.TB, databaseURL, name string, extra ...string) *workerProc {
	t.Helper()
	return startWorkerProcEnv(t, databaseURL, name, nil, extra...)
}

// startWorkerProcEnv is startWorkerProc with env ("KEY=value") added to the
// process's environment, over this process's own.
func startWorkerProcEnv(t testing.TB, databaseURL, name string, env []string, extra ...string) *workerProc {
	t.Helper()
	simLog := filepath.Join(t.TempDir(), name+".jsonl")
	f := testPeer(t)
	args := append([]string{"worker", "--listen", "127.0.0.1:0", "--database-url", storetest.WorkerURL(t, databaseURL),
		"--name", name, "--sim-log", simLog, "--log-level", "info", "--shutdown-grace", "10s",
		"--peer-tls-ca", f.CA, "--peer-tls-cert", f.Worker.Cert, "--peer-tls-key", f.Worker.Key,
		"--peer-verify-keys", f.VerifyKey}, extra...)
	w := startChild(t, name, "worker serving", env, args)
	w.simLog = simLog
	return w
}

// startChild runs this test binary again as `fanout ARGS...` (childMain), a
// process of its own, and waits until its log says serving.
func startChild(t testing.TB, name, serving string, env, args []string) *workerProc {
	t.Helper()
	w := &workerProc{name: name, logs: &logTail{}, stdout: &lockedBuffer{}, exited: make(chan struct{})}
	raw, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	w.cmd = exec.Command(os.Args[0], "-test.run=^$")
	w.cmd.Env = append(append(os.Environ(), env...), envE2EArgs+"="+string(raw))
	// A child must not outlive the test binary, whatever happens to it.
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := w.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	w.cmd.Stdout = w.stdout
	if err := w.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	addr := make(chan string, 1)
	go func() {
		defer close(w.exited)
		scanLog(stderr, w.logs, serving, addr)
		_ = w.cmd.Wait() // after every read of the pipe, as exec requires
	}()
	t.Cleanup(func() { w.stop(t) })
	select {
	case w.addr = <-addr:
	case <-w.exited:
		t.Fatalf("%s exited before serving:\n%s", name, w.logs)
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not serve within 60s:\n%s", name, w.logs)
	}
	return w
}

// stop asks the process to shut down (SIGTERM) and kills it if it takes too long.
func (w *workerProc) stop(t testing.TB) {
	select {
	case <-w.exited:
	default:
		_ = w.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-w.exited:
		case <-time.After(20 * time.Second):
			t.Errorf("%s ignored SIGTERM for 20s; killing it", w.name)
			_ = w.cmd.Process.Kill()
			<-w.exited
		}
	}
	if t.Failed() {
		t.Logf("%s log (tail):\n%s", w.name, w.logs)
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (w *workerProc) kill(t testing.TB) {
	t.Helper()
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 worker %s: %v", w.name, err)
	}
	<-w.exited
}

// calls returns the worker's sim calls of run runID.
func (w *workerProc) calls(t testing.TB, runID string) []call {
	t.Helper()
	recs, err := llm.ReadCallLog(w.simLog)
	if os.IsNotExist(err) || (err != nil && strings.Contains(err.Error(), "no such file")) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []call
	for _, r := range recs {
		if r.RunID == runID {
			out = append(out, call{CallRecord: r, worker: w.name})
		}
	}
	return out
}

// call is one sim call and the worker that made it.
type call struct {
	llm.CallRecord
	worker string
}

// orchestratorProc is `fanout orchestrator` run by Main in this process.
type orchestratorProc struct {
	addr   string
	http   string // the HTTP listener's base URL ("" when off)
	logs   *logTail
	cancel context.CancelFunc
	done   chan int // Main's exit code
	client fanoutv1.OrchestratorServiceClient
}

// startOrchestratorMain runs Main(ctx, "orchestrator", ...) in a goroutine on
// a loopback port and returns once it serves, with a client dialled to it.
func startOrchestratorMain(t testing.TB, databaseURL string, workers []*workerProc, extra ...string) *orchestratorProc {
	t.Helper()
	args := orchestratorArgs(t, databaseURL, workers, append([]string{"--shutdown-grace", "20s"}, extra...)...)
	ctx, cancel := context.WithCancel(context.Background())
	o := &orchestratorProc{logs: &logTail{}, cancel: cancel, done: make(chan int, 1)}
	pr, pw := io.Pipe()
	addr := make(chan string, 1)
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		scanLog(pr, o.logs, "orchestrator serving", addr)
	}()
	var stdout bytes.Buffer
	go func() {
		code := Main(ctx, args, &stdout, pw, testGetenv)
		_ = pw.Close()
		<-scanned
		o.done <- code
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-o.done:
			if code != 0 {
				t.Errorf("orchestrator exited %d", code)
			}
		case <-time.After(60 * time.Second):
			t.Errorf("orchestrator did not stop within 60s")
		}
		if t.Failed() {
			t.Logf("orchestrator log (tail):\n%s", o.logs)
		}
	})
	select {
	case o.addr = <-addr:
	case code := <-o.done:
		o.done <- code
		t.Fatalf("orchestrator exited %d before serving:\n%s", code, o.logs)
	case <-time.After(30 * time.Second):
		t.Fatalf("orchestrator did not serve within 30s:\n%s", o.logs)
	}
	o.client = dial(t, o.addr)
	o.http = logAttr(o.logs.all(), "orchestrator serving", "http")
	return o
}

// logAttr is the string attribute attr of the first JSON log line in logs
// whose msg is msg ("" if none).
func logAttr(logs, msg, attr string) string {
	for line := range strings.Lines(logs) {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == msg {
			v, _ := rec[attr].(string)
			return v
		}
	}
	return ""
}

// orchestratorArgs is the command line of `fanout orchestrator` on a
// loopback port of its choice, dispatching to workers, with the test
// fleet's peer credentials; extra are more flags (a later one wins).
func orchestratorArgs(t testing.TB, databaseURL string, workers []*workerProc, extra ...string) []string {
	t.Helper()
	addrs := make([]string, len(workers))
	for i, w := range workers {
		addrs[i] = w.addr
	}
	f := testPeer(t)
	return append([]string{"orchestrator", "--listen", "127.0.0.1:0", "--database-url", storetest.NodeURL(t, databaseURL),
		"--admin-database-url", storetest.AdminURL(t, databaseURL),
		"--workers", strings.Join(addrs, ","), "--log-level", "info", "--auth", "none",
		"--peer-tls-ca", f.CA, "--peer-tls-cert", f.Orchestrator.Cert, "--peer-tls-key", f.Orchestrator.Key,
		"--peer-signing-key", f.SigningKey}, extra...)
}

// dial returns a client of the orchestrator at addr. The test
// orchestrators run with --auth none, where a caller is the tenant it
// names: every call names tenant e2e (the tenant of the test specs).
func dial(t testing.TB, addr string) fanoutv1.OrchestratorServiceClient {
	t.Helper()
	return tenantClient(t, addr, "e2e")
}

// tenantClient is dial naming tenant instead.
func tenantClient(t testing.TB, addr, tenant string) fanoutv1.OrchestratorServiceClient {
	t.Helper()
	md := []string{orchestrator.TenantMetadataKey, tenant}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
			invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(metadata.AppendToOutgoingContext(ctx, md...), method, req, reply, cc, opts...)
		}),
		grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
			streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(metadata.AppendToOutgoingContext(ctx, md...), desc, cc, method, opts...)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return fanoutv1.NewOrchestratorServiceClient(conn)
}

// runStateListener records when this process heard each ledger run notice
// ("exhausted <run>", "cancelled <run>", "closed <run>"). Hearing a NOTIFY
// is an upper bound of its transaction's commit time.
type runStateListener struct {
	mu    sync.Mutex
	heard map[string]time.Time // payload -> first time heard
	wake  chan struct{}
}

func listenRunState(t testing.TB, databaseURL string) *runStateListener {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "LISTEN fanout_run_state"); err != nil {
		cancel()
		t.Fatal(err)
	}
	l := &runStateListener{heard: map[string]time.Time{}, wake: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			at := time.Now()
			l.mu.Lock()
			if _, ok := l.heard[n.Payload]; !ok {
				l.heard[n.Payload] = at
			}
			close(l.wake)
			l.wake = make(chan struct{})
			l.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = conn.Close(context.Background())
	})
	return l
}

// at returns when payload was heard, waiting up to timeout for it.
func (l *runStateListener) at(payload string, timeout time.Duration) (time.Time, bool) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		at, ok := l.heard[payload]
		wake := l.wake
		l.mu.Unlock()
		if ok {
			return at, true
		}
		select {
		case <-wake:
		case <-deadline.C:
			return time.Time{}, false
		}
	}
}

// runAll calls Run and collects every event until the stream ends.
func runAll(t testing.TB, c fanoutv1.OrchestratorServiceClient, s *fanoutv1.RunSpec) []*fanoutv1.RunEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	stream, err := c.Run(ctx, &fanoutv1.RunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	return recvAll(t, func() (*fanoutv1.RunEvent, error) {
		m, err := stream.Recv()
		return m.GetEvent(), err
	})
}

// watchAll streams a run's events until it ends.
func watchAll(t testing.TB, c fanoutv1.OrchestratorServiceClient, runID string, each func(*fanoutv1.RunEvent)) []*fanoutv1.RunEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	stream, err := c.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	return recvAll(t, func() (*fanoutv1.RunEvent, error) {
		m, err := stream.Recv()
		if err == nil && each != nil {
			each(m.GetEvent())
		}
		return m.GetEvent(), err
	})
}

func recvAll(t testing.TB, next func() (*fanoutv1.RunEvent, error)) []*fanoutv1.RunEvent {
	t.Helper()
	var evs []*fanoutv1.RunEvent
	for {
		ev, err := next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("run stream: %v (after %d events)", err, len(evs))
		}
		evs = append(evs, ev)
	}
	if len(evs) == 0 || evs[len(evs)-1].GetRunFinished() == nil {
		t.Fatalf("run stream ended after %d events without RunFinished", len(evs))
	}
	return evs
}

// e2eSpec is a run of n independent tasks on the sim model.
func e2eSpec(key string, n int, limit int64) *fanoutv1.RunSpec {
	s := &fanoutv1.RunSpec{
		IdempotencyKey: key,
		TenantId:       "e2e",
		Goal:           "find facts",
		// Greedy: these runs prove what the budget does to work in flight
		// when it runs out (I6); by forecast, little would be in flight.
		Budget: &fanoutv1.Budget{LimitTokens: limit, MinReservationTokens: 300,
			Admission: fanoutv1.AdmissionPolicy_ADMISSION_POLICY_GREEDY},
		Limits: &fanoutv1.Limits{MaxConcurrency: 16},
		Model:  &fanoutv1.ModelSettings{Provider: "sim", MaxOutputTokens: 200, Seed: 7},
	}
	for i := range n {
		s.Tasks = append(s.Tasks, &fanoutv1.TaskSpec{
			Id: fmt.Sprintf("t%02d", i), Instruction: fmt.Sprintf("look up item %d", i),
			TokenBudget: 50_000, MaxIterations: 5, AllowedTools: []string{"search"},
		})
	}
	return s
}

func terminal(s fanoutv1.TaskStatus) bool {
	switch s {
	case fanoutv1.TaskStatus_TASK_STATUS_UNSPECIFIED, fanoutv1.TaskStatus_TASK_STATUS_PENDING,
		fanoutv1.TaskStatus_TASK_STATUS_RUNNING:
		return false
	}
	return true
}

// checkOutcomes checks that outcomes list every task of s in dispatch order,
// each with a terminal status.
func checkOutcomes(t testing.TB, s *fanoutv1.RunSpec, outcomes []*fanoutv1.TaskOutcome) {
	t.Helper()
	if len(outcomes) != len(s.GetTasks()) {
		t.Fatalf("%d task outcomes, want %d", len(outcomes), len(s.GetTasks()))
	}
	for i, o := range outcomes {
		if o.GetTaskId() != s.GetTasks()[i].GetId() || o.GetDispatchIndex() != int32(i) {
			t.Errorf("outcome %d is task %s (index %d), want %s", i, o.GetTaskId(), o.GetDispatchIndex(), s.GetTasks()[i].GetId())
		}
		if !terminal(o.GetStatus()) {
			t.Errorf("task %s ended %s, not terminal", o.GetTaskId(), o.GetStatus())
		}
	}
}

// checkConserved checks the SQL conservation check over every account,
// which must include the run's, and that the run spent no more than its
// limit.
func checkConserved(t testing.TB, pool *store.Pool, runID string) (spent, limit int64) {
	t.Helper()
	ctx := context.Background()
	var runAccounts int
	var conserved bool
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE run_id = $1), coalesce(bool_and(conserved), false)
		FROM conservation_check`, runID).Scan(&runAccounts, &conserved); err != nil {
		t.Fatal(err)
	}
	if runAccounts == 0 {
		t.Errorf("conservation_check has no account of run %s: it checked nothing of the run", runID)
	}
	if !conserved {
		t.Error("conservation_check: not conserved")
	}
	if err := pool.QueryRow(ctx, `SELECT spent_tokens, limit_tokens FROM run_spend WHERE run_id = $1`, runID).Scan(&spent, &limit); err != nil {
		t.Fatal(err)
	}
	if spent > limit {
		t.Errorf("run %s spent %d of a %d limit", runID, spent, limit)
	}
	return spent, limit
}

// waitFor polls cond every 50ms until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s (%s)", what, timeout, state)
		}
		time.Sleep(50 * time.Millisecond) // a poll interval, not synchronization
	}
}

func openPool(t testing.TB, url string) *store.Pool {
	t.Helper()
	pool, err := store.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// waitFleetConnected runs small runs of tasks without tools on c until
// tasks of one run started on n different workers, within 30 s: the
// orchestrator's channel to every worker is up. A test whose claim needs
// its tasks spread over the fleet calls it first; on a loaded machine a
// worker's TLS handshake can finish after a run's first wave was dispatched
// to the workers already connected (WorkerPool.Connected).
func waitFleetConnected(t testing.TB, c fanoutv1.OrchestratorServiceClient, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		s := e2eSpec(fmt.Sprintf("fleet-warm-%d-%d", time.Now().UnixNano(), i), 2*n, 1_000_000)
		for _, task := range s.GetTasks() {
			task.AllowedTools = nil
		}
		seen := map[string]bool{}
		for _, ev := range runAll(t, c, s) {
			if st := ev.GetTaskStarted(); st != nil {
				seen[st.GetWorker()] = true
			}
		}
		if len(seen) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tasks started on %d workers (%v) in 30 s of runs; want %d: a worker is not connected", len(seen), seen, n)
		}
	}
}
