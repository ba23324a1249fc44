package orchestrator_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent/llm"
)

// noFallback is a fallback poll that never ticks in a test: what reaches a
// follower on another node comes by notification (or by the re-read when
// the LISTEN connection is back).
var noFallback = orchestrator.Config{WatchFallbackPoll: time.Hour}

// followAcross starts a run of a chain of tasks (each depends on the one
// before) on orchestrator a and follows it with WatchRun on orchestrator b
// from its first event to its RunFinished, and returns how long each event
// took to reach b after its write began (the event's time is its
// transaction's).
func followAcross(t testing.TB, a, b *node, key string, tasks int) []time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), patience)
	defer cancel()
	s := spec(key, tasks, 1_000_000)
	for i := 1; i < tasks; i++ {
		s.Tasks[i].DependsOn = []string{s.Tasks[i-1].GetId()}
	}
	start, err := a.client.StartRun(ctx, &fanoutv1.StartRunRequest{Spec: s})
	if err != nil {
		t.Fatal(err)
	}
	ws, err := b.client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: start.GetRunId()})
	if err != nil {
		t.Fatal(err)
	}
	var took []time.Duration
	for want := int64(1); ; want++ {
		m, err := ws.Recv()
		if errors.Is(err, io.EOF) {
			t.Fatalf("the stream on the other node ended after %d events without RunFinished", want-1)
		}
		if err != nil {
			t.Fatalf("the stream on the other node, after %d events: %v", want-1, err)
		}
		ev := m.GetEvent()
		took = append(took, time.Since(ev.GetTime().AsTime()))
		if ev.GetSequence() != want {
			t.Fatalf("event %d has sequence %d", want, ev.GetSequence())
		}
		if ev.GetRunFinished() != nil {
			return took
		}
	}
}

// TestFollowerOnAnotherNodeHearsEachEvent: a WatchRun on orchestrator B of
// a run that orchestrator A drives gets each event as A commits it: every
// write of a run's events NOTIFYs its new head, and B's notifier wakes its
// followers of that run. B's fallback poll is an hour apart, so nothing
// else can bring them (A's wakes and its end's publish reach A's
// followers only); each event arrives within a second. The run is a chain
// of three tasks of one 1s call each, so that an event left to be found
// with a later one (the run's end, whose notification is the run store's
// own) would be 2s late.
func TestFollowerOnAnotherNodeHearsEachEvent(t *testing.T) {
	t.Parallel()
	bu := setup(t)
	w, _ := bu.worker(t, "w1", llm.SimConfig{Latency: time.Second, FinishAfter: 1}, 8)
	a := bu.orchestrator(t, "a", noFallback, w)
	b := bu.orchestrator(t, "b", noFallback, w)
	took := followAcross(t, a, b, "across", 3)
	slices.Sort(took)
	t.Logf("%d events; from write to the other node's stream: p50 %v, max %v", len(took), took[len(took)/2], took[len(took)-1])
	if worst := took[len(took)-1]; worst > time.Second {
		t.Errorf("an event took %v to reach the other node's stream; want well under the fallback poll (1h), within 1s", worst)
	}
}

// BenchmarkCrossNodeFollower measures how long an event takes from the
// start of its write on the orchestrator driving the run to a WatchRun
// stream on another orchestrator: by the poll of heads every 150 ms
// (notifications off, as before them) and by notification (the fallback
// poll an hour apart). Each op is one run of a chain of 3 tasks of one
// 100 ms sim call.
//
//	go test -run '^$' -bench CrossNodeFollower -benchtime 20x ./orchestrator/
func BenchmarkCrossNodeFollower(b *testing.B) {
	for _, c := range []struct {
		name   string
		cfg    orchestrator.Config
		change func(*orchestrator.EngineParams)
	}{
		{"poll", orchestrator.Config{}, func(p *orchestrator.EngineParams) { p.Events = nil }},
		{"notify", noFallback, nil},
	} {
		b.Run(c.name, func(b *testing.B) {
			bu := setup(b)
			w, _ := bu.worker(b, "w1", llm.SimConfig{Latency: 100 * time.Millisecond, FinishAfter: 1}, 8)
			a := bu.orchestratorWith(b, "a", c.cfg, c.change, w)
			o := bu.orchestratorWith(b, "b", c.cfg, c.change, w)
			var took []time.Duration
			b.ResetTimer()
			for i := range b.N {
				took = append(took, followAcross(b, a, o, fmt.Sprint("bench-", i), 3)...)
			}
			b.StopTimer()
			slices.Sort(took)
			q := func(p float64) float64 { return float64(took[int(p*float64(len(took)-1))]) / 1e6 }
			b.ReportMetric(q(0.5), "p50-ms")
			b.ReportMetric(q(0.9), "p90-ms")
			b.ReportMetric(q(1), "max-ms")
		})
	}
}

// TestFollowerRereadsWhenListeningAgain: an event whose notification is
// lost (written here by hand, with no NOTIFY, as one sent while the LISTEN
// connection is down is lost) does not reach a follower on another node
// until its notifier's connection is killed: once it listens again, the
// node re-reads the head of every run followed there, and the stream gets
// the event, with the fallback poll an hour apart. The connection is
// killed once before the event too, so that the node has read the run's
// current head when the event is written: only a re-read that tells the
// new head from that one wakes the stream (against the zero head of a
// node that never polled, any read differs).
func TestFollowerRereadsWhenListeningAgain(t *testing.T) {
	t.Parallel()
	bu := setup(t)
	// One task whose call outlasts the test: the run writes nothing more
	// once its task has started.
	w, _ := bu.worker(t, "w1", llm.SimConfig{Latency: time.Hour}, 8)
	a := bu.orchestrator(t, "a", noFallback, w)
	b := bu.orchestrator(t, "b", noFallback, w)
	ctx, cancel := context.WithTimeout(t.Context(), patience)
	defer cancel()
	start, err := a.client.StartRun(ctx, &fanoutv1.StartRunRequest{Spec: spec("lost", 1, 1_000_000)})
	if err != nil {
		t.Fatal(err)
	}
	runID := start.GetRunId()
	defer func() {
		_, _ = a.client.CancelRun(context.WithoutCancel(ctx), &fanoutv1.CancelRunRequest{RunId: runID})
	}()
	ws, err := b.client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan *fanoutv1.RunEvent, 64)
	go func() {
		defer close(events)
		for {
			m, err := ws.Recv()
			if err != nil {
				return
			}
			events <- m.GetEvent()
		}
	}()
	var last int64
	for last == 0 { // up to the task's start: the run is quiet then
		select {
		case ev := <-events:
			if ev.GetTaskStarted() != nil {
				last = ev.GetSequence()
			}
		case <-ctx.Done():
			t.Fatal("no TaskStarted on the other node's stream")
		}
	}
	// The node reads the run's current head (its first re-read).
	killListener(t, bu)
	for deadline := time.Now().Add(patience); b.engine.FollowedHead(runID).Sequence != last; {
		if time.Now().After(deadline) {
			t.Fatalf("the other node's head of the run is %v after it listened again; want sequence %d",
				b.engine.FollowedHead(runID), last)
		}
		time.Sleep(10 * time.Millisecond) // polling the node's head
	}
	// A copy of the run's first event, appended as the store appends but
	// without the NOTIFY.
	if _, err := bu.pool.Exec(ctx, `WITH seq AS (
			UPDATE fanout.run SET last_sequence = last_sequence + 1 WHERE run_id = $1
			RETURNING tenant_id, last_sequence)
		INSERT INTO fanout.run_event (run_id, sequence, tenant_id, event, event_key)
		SELECT $1, seq.last_sequence, seq.tenant_id, e.event, gen_random_uuid()
		  FROM seq, fanout.run_event e WHERE e.run_id = $1 AND e.sequence = 1`, runID); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-events:
		t.Fatalf("event %d reached the stream with no notification and no poll", ev.GetSequence())
	case <-time.After(300 * time.Millisecond):
	}
	killListener(t, bu)
	select {
	case ev := <-events:
		if ev.GetSequence() != last+1 {
			t.Fatalf("got event %d; want %d, the one whose notification was lost", ev.GetSequence(), last+1)
		}
	case <-ctx.Done():
		t.Fatalf("event %d, whose notification was lost, did not reach the stream once the node listened again", last+1)
	}
}

// killListener ends the backend's LISTEN connection (its notifier
// reconnects).
func killListener(t *testing.T, bu *testBundle) {
	t.Helper()
	var killed bool
	if err := bu.pool.QueryRow(t.Context(), `SELECT coalesce(bool_or(pg_terminate_backend(pid)), false)
		FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`,
		store.ListenerApplicationName).Scan(&killed); err != nil || !killed {
		t.Fatalf("kill the listening connection: %v, %v", killed, err)
	}
}

// TestConnectionsDoNotGrowWithRunsAndStreams: one process (an orchestrator
// and a worker on one backend) with 50 runs in flight and 200 WatchRun
// streams on them, through their ends, holds no more PostgreSQL
// connections than its pools and its one LISTEN connection
// (docs/operations.md, "Pool sizes"): nothing opens a connection per run
// or per stream, and what its listening session ran last is the schema's
// fixed LISTENs (store.ListenStatement), also once it has listened again
// with every run followed.
func TestConnectionsDoNotGrowWithRunsAndStreams(t *testing.T) {
	t.Parallel()
	const runs, streamsPerRun = 50, 4
	bu := setup(t)
	w, _ := bu.worker(t, "w1", llm.SimConfig{Latency: time.Hour}, runs)
	n := bu.orchestrator(t, "o1", orchestrator.Config{}, w)
	st := bu.backend.Stores()
	pools := map[string]int64{ // no admin pool: no --admin-database-url
		"fanout-ledger":               int64(st.LedgerPool().Config().MaxConns),
		"fanout-api":                  int64(st.APIPool().Config().MaxConns),
		store.ListenerApplicationName: 1,
	}
	peak := map[string]int64{}
	sample := func() {
		rows, err := bu.pool.Query(t.Context(), `SELECT application_name, count(*) FROM pg_stat_activity
			WHERE datname = current_database() GROUP BY 1`) // this query's connection is the ledger pool's
		if err != nil {
			t.Error(err)
			return
		}
		defer rows.Close()
		for rows.Next() {
			var name string
			var count int64
			if err := rows.Scan(&name, &count); err != nil {
				t.Error(err)
				return
			}
			peak[name] = max(peak[name], count)
		}
	}
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				sample()
				return
			case <-tick.C:
				sample()
			}
		}
	}()

	ctx, cancel := context.WithTimeout(t.Context(), 2*patience)
	defer cancel()
	ids := make([]string, runs)
	for i := range ids {
		start, err := n.client.StartRun(ctx, &fanoutv1.StartRunRequest{Spec: spec(fmt.Sprint("conns-", i), 1, 1_000_000)})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = start.GetRunId()
	}
	ended := make(chan error, runs*streamsPerRun)
	opened := make(chan struct{}, runs*streamsPerRun)
	for _, id := range ids {
		for range streamsPerRun {
			go func() {
				ws, err := n.client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: id})
				if err == nil {
					_, err = ws.Header() // the stream is open on the server
				}
				opened <- struct{}{}
				if err == nil {
					_, _, err = recvUntilEnd(func() (*fanoutv1.RunEvent, error) {
						m, err := ws.Recv()
						return m.GetEvent(), err
					}, nil)
				}
				ended <- err
			}()
		}
	}
	for range runs * streamsPerRun {
		await(t, opened, "a WatchRun stream opened")
	}
	// Every run followed: the LISTEN connection, killed, comes back to the
	// same channels.
	connected := make(chan struct{}, 2)
	defer st.Notifier.Subscribe(store.RunEventsChannel, store.Handler{Connected: func() { connected <- struct{}{} }})()
	await(t, connected, "the notifier listening")
	if _, err := bu.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database()`, store.ListenerApplicationName); err != nil {
		t.Fatal(err)
	}
	await(t, connected, "the notifier listening again")
	for deadline := time.Now().Add(patience); ; { // until the killed session is gone
		var listens []string
		if err := bu.pool.QueryRow(ctx, `SELECT coalesce(array_agg(query), '{}') FROM pg_stat_activity
			WHERE application_name = $1 AND datname = current_database()`, store.ListenerApplicationName).Scan(&listens); err != nil {
			t.Fatal(err)
		}
		if len(listens) == 1 && listens[0] == store.ListenStatement {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with %d runs followed, the listening sessions last ran %q; want one, whose last statement is the fixed %q",
				runs, listens, store.ListenStatement)
		}
		time.Sleep(10 * time.Millisecond) // polling pg_stat_activity
	}
	for _, id := range ids {
		if _, err := n.client.CancelRun(ctx, &fanoutv1.CancelRunRequest{RunId: id, Reason: "done"}); err != nil {
			t.Fatal(err)
		}
	}
	for range runs * streamsPerRun {
		select {
		case err := <-ended:
			if err != nil {
				t.Fatalf("a stream: %v", err)
			}
		case <-ctx.Done():
			t.Fatal("not every stream got its RunFinished")
		}
	}
	close(stop)
	<-sampled

	var bound int64
	for name, n := range peak {
		limit, ok := pools[name]
		switch {
		case !ok && name != "": // "": the test's own harness connections, not the process's
			t.Errorf("%d connections named %q: not of a pool of the process", n, name)
		case ok && n > limit:
			t.Errorf("%s: %d connections at the peak; its pool has %d", name, n, limit)
		}
	}
	for _, limit := range pools {
		bound += limit
	}
	t.Logf("peak connections by application_name with %d runs and %d streams: %v (bound %d)", runs, runs*streamsPerRun, peak, bound)
}
