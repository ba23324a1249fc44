package main

// A restart of PostgreSQL in the middle of a run is survived: the store
// retries what the restart cut off (issue 12; docs/operations.md, "Database
// restarts and failover").

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/pglocal"
	"github.com/fanout/fanout/store/storetest"
)

// TestPostgresRestartMidRun: `pg_ctl restart -m fast` of the only database
// while a 30-task run is in flight, with an orchestrator and two worker
// processes on it. Every connection is cut, the statements in flight roll
// back or commit with their replies lost, and for a moment nothing can
// connect. The run still succeeds with every task, the ledger is conserved
// with nothing held, and a client watching the run sees it end with
// RunFinished rather than an error.
func TestPostgresRestartMidRun(t *testing.T) {
	t.Parallel()
	srv, url := startOwnCluster(t)
	pool := openPool(t, url)
	sim := []string{"--sim-latency", "200ms", "--sim-tool-calls", "1", "--sim-finish-after", "2",
		"--poll-interval", e2ePoll, "--sweep-interval", e2eSweep}
	w1 := startWorkerProc(t, url, "w1", sim...)
	w2 := startWorkerProc(t, url, "w2", sim...)
	orch := startOrchestratorMain(t, url, []*workerProc{w1, w2}, "--poll-interval", e2ePoll, "--sweep-interval", e2eSweep)

	s := e2eSpec("pg-restart", 30, 5_000_000)
	s.Limits.MaxConcurrency = 4
	begun := time.Now()
	started, err := orch.client.StartRun(context.Background(), &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	runID := started.GetRunId()
	watched := watchInBackground(orch.client, runID)

	// The scenario: the restart comes about 1.5 s into the run, once some
	// of its tasks have started.
	waitFor(t, 30*time.Second, "1.5 s into the run, with some of its tasks started", func() (bool, string) {
		n := tasksStarted(t, pool, runID)
		return n >= 4 && time.Since(begun) >= 1500*time.Millisecond, strconv.Itoa(n) + " started"
	})
	done := tasksIn(t, pool, runID, "SUCCEEDED")
	if done >= len(s.GetTasks())-6 {
		t.Fatalf("%d of %d tasks were done at the restart: the run does not span it", done, len(s.GetTasks()))
	}
	pool.Close() // its connections die with the server; the checks below use a new pool
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	restartedAt := time.Now()
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("postgres restarted in %v, %v into the run, with %d of %d tasks done",
		time.Since(restartedAt).Round(time.Millisecond), restartedAt.Sub(begun).Round(time.Millisecond), done, len(s.GetTasks()))

	var w watchResult
	select {
	case w = <-watched:
	case <-time.After(90 * time.Second):
		t.Fatal("the WatchRun stream did not end within 90s of the restart")
	}
	if w.err != nil {
		t.Fatalf("the WatchRun stream ended with %v after %d events, want RunFinished", w.err, len(w.events))
	}
	if len(w.events) == 0 || w.events[len(w.events)-1].GetRunFinished() == nil {
		t.Fatalf("the WatchRun stream ended after %d events without RunFinished", len(w.events))
	}
	t.Logf("the run ended %v after the restart began", time.Since(restartedAt).Round(time.Millisecond))
	fin := w.events[len(w.events)-1].GetRunFinished()
	checkOutcomes(t, s, fin.GetResult().GetTasks())
	succeeded := 0
	for _, o := range fin.GetResult().GetTasks() {
		if o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			succeeded++
		} else {
			t.Errorf("task %s ended %s: %s", o.GetTaskId(), o.GetStatus(), o.GetSummary().GetError())
		}
	}
	if succeeded != len(s.GetTasks()) {
		t.Errorf("%d of %d tasks succeeded", succeeded, len(s.GetTasks()))
	}
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		t.Errorf("run ended %s (%q), want SUCCEEDED", fin.GetState(), fin.GetCancelCause())
	}
	// The positive control: the restart did cut calls off, and the store
	// retried them (each retry is a warning in its process's log).
	retries := map[string]int{"orchestrator": strings.Count(orch.logs.all(), retryLogLine)}
	for _, w := range []*workerProc{w1, w2} {
		retries[w.name] = strings.Count(w.logs.all(), retryLogLine)
	}
	t.Logf("database retries by process: %v", retries)
	if retries["orchestrator"]+retries[w1.name]+retries[w2.name] == 0 {
		t.Error("no process retried a database call: the restart cut nothing off, so the test proved nothing")
	}
	after := openPool(t, url)
	var state string
	if err := after.QueryRow(ctx, `SELECT state FROM run WHERE run_id = $1`, runID).Scan(&state); err != nil {
		t.Fatal(err)
	}
	if state != "SUCCEEDED" {
		t.Errorf("the run is %s in the database, want SUCCEEDED", state)
	}
	waitClosed(t, after, runID)
	checkConserved(t, after, runID)
	var held int
	if err := after.QueryRow(ctx, `SELECT count(*) FROM reservation WHERE run_id = $1 AND state = 'held'`, runID).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Errorf("%d reservations of the run are still held", held)
	}
	// Each task finished once: a retried append whose first try committed
	// must not have written its TaskFinished again.
	var finished, tasks int
	if err := after.QueryRow(ctx, `SELECT count(*), count(DISTINCT event->'task_finished'->'outcome'->>'task_id')
		FROM run_event WHERE run_id = $1 AND event ? 'task_finished'`, runID).Scan(&finished, &tasks); err != nil {
		t.Fatal(err)
	}
	if finished != len(s.GetTasks()) || tasks != len(s.GetTasks()) {
		t.Errorf("%d TaskFinished events of %d tasks, want one for each of the %d", finished, tasks, len(s.GetTasks()))
	}
}

// retryLogLine is the message of the store's warning for a retried database error.
const retryLogLine = `"msg":"database error; retrying"`

// startOwnCluster starts a throwaway PostgreSQL cluster for one test (one
// that the test may restart: the shared server of storetest must not be),
// creates and migrates database fanout on it with the node role that
// storetest.NodeURL names, and returns the cluster and the owner's URL of
// the database. The cluster is stopped and removed when t ends.
func startOwnCluster(t *testing.T) (*pglocal.Server, string) {
	t.Helper()
	// startWorkerProc and startOrchestratorMain connect as the login roles
	// of storetest.NodeURL, WorkerURL and AdminURL, which those functions
	// also create on the shared server, where the groups exist once the
	// template is migrated.
	shared := storetest.NewDB(t)
	storetest.NodeURL(t, shared)
	storetest.WorkerURL(t, shared)
	storetest.AdminURL(t, shared)
	dir := t.TempDir()
	// The cluster runs as another OS user when we are root; it must be able
	// to enter the directory.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := &lockedBuffer{}
	srv, err := pglocal.Start(ctx, pglocal.Config{DataDir: filepath.Join(dir, "data"), Fast: true, Log: log})
	if errors.Is(err, pglocal.ErrNoBinaries) {
		t.Fatalf("this test restarts its own PostgreSQL, so it needs the server binaries: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := srv.Stop(ctx); err != nil {
			t.Errorf("stop the test's cluster: %v", err)
		}
		if t.Failed() {
			t.Logf("the test's PostgreSQL log (tail):\n%s", tailLines(log.String(), 40))
		}
	})
	admin := srv.URL("postgres")
	if err := store.CreateDatabase(ctx, admin, "fanout"); err != nil {
		t.Fatal(err)
	}
	url := srv.URL("fanout")
	if err := store.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	makeTestLogins(t, admin)
	return srv, url
}

// makeTestLogins creates, on the server of adminURL (a superuser's), the
// login roles storetest.NodeURL, WorkerURL and AdminURL name, with the
// passwords they use.
func makeTestLogins(t testing.TB, adminURL string) {
	t.Helper()
	conn := openPool(t, adminURL)
	defer conn.Close()
	if _, err := conn.Exec(context.Background(), fmt.Sprintf(`CREATE ROLE %[1]s LOGIN PASSWORD '%[1]s' IN ROLE fanout_app;
		CREATE ROLE %[2]s LOGIN PASSWORD '%[2]s' IN ROLE fanout_worker;
		CREATE ROLE %[3]s LOGIN PASSWORD '%[3]s' IN ROLE fanout_admin`,
		storetest.NodeRole, storetest.WorkerRole, storetest.AdminRole)); err != nil {
		t.Fatal(err)
	}
}

// tailLines is the last n lines of s.
func tailLines(s string, n int) string {
	lines := bytes.Split([]byte(s), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// watchResult is how a WatchRun stream ended: its events and the error
// that ended it (nil for the stream's normal end).
type watchResult struct {
	events []*fanoutv1.RunEvent
	err    error
}

// watchInBackground streams the run's events in a goroutine until the
// stream ends and sends how it ended.
func watchInBackground(c fanoutv1.OrchestratorServiceClient, runID string) <-chan watchResult {
	out := make(chan watchResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var r watchResult
		defer func() { out <- r }()
		stream, err := c.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID})
		if err != nil {
			r.err = err
			return
		}
		for {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				r.err = err
				return
			}
			r.events = append(r.events, m.GetEvent())
		}
	}()
	return out
}

// tasksStarted counts the run's tasks that have started (running or ended).
func tasksStarted(t testing.TB, pool *store.Pool, runID string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM task WHERE run_id = $1 AND started_at IS NOT NULL`,
		runID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
