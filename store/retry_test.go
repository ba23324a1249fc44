package store_test

// Calls whose reply is lost after the server committed them — the
// ambiguous commit of a connection cut at the wrong moment — are settled by
// their keys: retried, they neither fail nor do their work twice
// (store/retry.go; docs/operations.md, "Database restarts and failover").

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
)

// quiet is a logger for tests that make the store retry on purpose.
var quiet = slog.New(slog.DiscardHandler)

// cutProxy forwards TCP connections to a PostgreSQL server. Armed, it cuts
// one connection at the worst moment for a write: the server gets the
// statement (the first client message the armed predicate matches), runs
// and commits it, and its reply never reaches the client.
type cutProxy struct {
	lis    net.Listener
	target string
	mu     sync.Mutex
	armed  func(msg []byte) bool
	cuts   int
	wg     sync.WaitGroup
}

// bind matches an extended-protocol execution (a Bind message: pgx sends
// Bind, Execute and Sync together, the SQL text went earlier with Parse).
func bind(msg []byte) bool { return len(msg) > 0 && msg[0] == 'B' }

// commit matches the COMMIT of a transaction (simple protocol).
func commit(msg []byte) bool {
	return len(msg) > 0 && msg[0] == 'Q' && bytes.Contains(bytes.ToLower(msg), []byte("commit"))
}

// newCutProxy starts a proxy to the server of databaseURL and returns it
// with a pool (of one connection) that connects through it.
func newCutProxy(t *testing.T, databaseURL string) (*cutProxy, *pgxpool.Pool) {
	t.Helper()
	u, err := url.Parse(databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{lis: lis, target: u.Host}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		_ = lis.Close()
		p.wg.Wait()
	})
	u.Host = lis.Addr().String()
	pool, err := store.OpenPool(t.Context(), u.String(), store.PoolConfig{MaxConns: 1})
	if err != nil {
		t.Fatalf("open a pool through the proxy (a server with TLS cannot be cut this way): %v", err)
	}
	t.Cleanup(pool.Close)
	return p, pool
}

// arm makes the proxy cut the next connection that sends a message match
// accepts, after forwarding it, and starts counting cuts afresh.
func (p *cutProxy) arm(match func([]byte) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed, p.cuts = match, 0
}

// cutCount is how many connections the proxy has cut.
func (p *cutProxy) cutCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

func (p *cutProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		var doomed atomic.Bool
		closeBoth := func() { _ = c.Close(); _ = s.Close() }
		p.wg.Add(2)
		go func() { // client to server
			defer p.wg.Done()
			defer closeBoth()
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if err != nil {
					return
				}
				p.mu.Lock()
				if p.armed != nil && p.armed(buf[:n]) {
					p.armed = nil
					p.cuts++
					doomed.Store(true) // before the server can answer
				}
				p.mu.Unlock()
				if _, err := s.Write(buf[:n]); err != nil {
					return
				}
			}
		}()
		go func() { // server to client
			defer p.wg.Done()
			defer closeBoth()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if err != nil || doomed.Load() {
					// The server answered (so it committed: PostgreSQL sends
					// a reply at Sync, after the commit); the client never
					// hears it.
					return
				}
				if _, err := c.Write(buf[:n]); err != nil {
					return
				}
			}
		}()
	}
}

// checkCut fails t unless the proxy cut exactly one connection: otherwise
// the call under test never lost a reply and the test proved nothing.
func checkCut(t *testing.T, p *cutProxy) {
	t.Helper()
	if n := p.cutCount(); n != 1 {
		t.Fatalf("the proxy cut %d connections, want 1: no reply was lost", n)
	}
}

// TestLedgerCallsWhoseReplyIsLost: a reserve (keyed by its caller or not)
// and a settle whose commit's reply is lost are retried and return what
// the lost try did: one reservation, settled once.
func TestLedgerCallsWhoseReplyIsLost(t *testing.T) {
	t.Parallel()
	for _, coalesce := range []bool{false, true} {
		t.Run(fmt.Sprint("coalesce=", coalesce), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			proxy, pool := newCutProxy(t, b.url)
			l := store.NewLedger(pool, store.LedgerConfig{Coalesce: coalesce, Logger: quiet})
			defer l.Close()
			ra := b.openRun(t, "r1", 10_000, 10, 1_000)
			ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
			defer cancel()
			for _, key := range []string{"i1", ""} {
				proxy.arm(bind)
				res, err := l.Reserve(ctx, grant(ra, budget.ReserveParams{Account: ra.Tasks["t0"], Want: 100, Min: 10,
					Holder: "w1", TTL: ttl, Key: key}))
				if err != nil {
					t.Fatalf("reserve (key %q) whose reply was lost: %v", key, err)
				}
				checkCut(t, proxy)
				var rows int
				if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM reservation WHERE account_id = $1 AND state = 'held'`,
					int64(ra.Tasks["t0"])).Scan(&rows); err != nil {
					t.Fatal(err)
				}
				if rows != 1 {
					t.Fatalf("reserve (key %q) whose reply was lost: %d reservations held, want 1", key, rows)
				}
				proxy.arm(bind)
				settled, err := l.Settle(ctx, budget.SettleParams{Reservation: res.ID, Generation: res.Lease.Generation, Actual: 40})
				if err != nil {
					t.Fatalf("settle whose reply was lost: %v, want the first try's result", err)
				}
				checkCut(t, proxy)
				if settled.State != budget.ReservationSettled || settled.Actual != 40 {
					t.Errorf("settle whose reply was lost: %+v, want settled at 40", settled)
				}
				var settles int
				if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entry WHERE reservation_id = $1 AND kind = 'settle'`,
					int64(res.ID)).Scan(&settles); err != nil {
					t.Fatal(err)
				}
				if settles != 1 {
					t.Errorf("reservation %d has %d settle entries, want 1", res.ID, settles)
				}
			}
			b.checkConserved(t)
		})
	}
}

// TestAppendEventWhoseReplyIsLost: an event append whose commit's reply is
// lost is retried, finds its event by key and returns it: the run has it
// once.
func TestAppendEventWhoseReplyIsLost(t *testing.T) {
	t.Parallel()
	for _, coalesce := range []bool{false, true} {
		t.Run(fmt.Sprint("coalesce=", coalesce), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			proxy, pool := newCutProxy(t, b.url)
			rs := store.NewRuns(pool, store.RunsConfig{Coalesce: coalesce, Logger: quiet})
			defer rs.Close()
			ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
			defer cancel()
			if _, _, err := rs.CreateRun(ctx, draftRun("r1", "ten", "k", "a"), "n"); err != nil {
				t.Fatal(err)
			}
			proxy.arm(bind)
			ev, err := rs.AppendEvent(ctx, "r1", &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskQueued{
				TaskQueued: &fanoutv1.TaskQueued{TaskId: "a"}}})
			if err != nil {
				t.Fatalf("append whose reply was lost: %v", err)
			}
			checkCut(t, proxy)
			stored, err := rs.Events(ctx, "ten", "r1", 0, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(stored) != 1 {
				t.Fatalf("the run has %d events, want the one appended once: %v", len(stored), stored)
			}
			if ev.GetSequence() != stored[0].GetSequence() || !ev.GetTime().AsTime().Equal(stored[0].GetTime().AsTime()) {
				t.Errorf("append returned sequence %d at %v; stored %d at %v", ev.GetSequence(), ev.GetTime().AsTime(),
					stored[0].GetSequence(), stored[0].GetTime().AsTime())
			}
		})
	}
}

// TestRunWritesWhoseReplyIsLost: creating a run, finishing a task, failing
// the rest and finishing the run each answer as the lost try would have,
// re-reading by key, instead of "already taken" or "already ended".
func TestRunWritesWhoseReplyIsLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, pool := newCutProxy(t, b.url)
	rs := store.NewRuns(pool, store.RunsConfig{Logger: quiet})
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	step := func(what string, match func([]byte) bool, do func() error) {
		t.Helper()
		proxy.arm(match)
		if err := do(); err != nil {
			t.Fatalf("%s whose reply was lost: %v", what, err)
		}
		checkCut(t, proxy)
	}
	step("create run", commit, func() error {
		_, created, err := rs.CreateRun(ctx, draftRun("r1", "ten", "k", "a", "b"), "n")
		if err == nil && !created {
			err = errors.New("created false: it reports its own run as another's")
		}
		return err
	})
	step("start task", commit, func() error {
		o, err := rs.StartTask(ctx, "r1", "n", &fanoutv1.TaskStarted{TaskId: "a", Worker: "w1"})
		if err == nil && o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_RUNNING {
			err = fmt.Errorf("returned %v", o)
		}
		return err
	})
	step("finish task", bind, func() error {
		o, err := rs.FinishTask(ctx, "r1", "n", &fanoutv1.TaskOutcome{TaskId: "a", Status: fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED,
			TokensSpent: 7, Worker: "w1"})
		if err == nil && (o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED || o.GetTokensSpent() != 7) {
			err = fmt.Errorf("returned %v", o)
		}
		return err
	})
	step("fail tasks", bind, func() error {
		failed, err := rs.FailTasks(ctx, "r1", "n", "gave up")
		if err == nil && (len(failed) != 1 || failed[0].GetTaskId() != "b") {
			err = fmt.Errorf("returned %v, want task b", failed)
		}
		return err
	})
	// A read's reply lost is a read tried again: the head of a run is what
	// every WatchRun stream starts with, during a failover too.
	step("read the head", bind, func() error {
		h, err := rs.Head(ctx, "ten", "r1")
		if err == nil && h.Sequence == 0 {
			err = fmt.Errorf("returned the head %+v, want the run's", h)
		}
		return err
	})
	step("finish run", bind, func() error {
		run, ended, err := rs.FinishRun(ctx, "r1", "n", fanoutv1.RunState_RUN_STATE_FAILED, "a task failed", nil)
		if err == nil && (!ended || run.GetState() != fanoutv1.RunState_RUN_STATE_FAILED) {
			err = fmt.Errorf("ended %v, state %s: it reports its own end as another's", ended, run.GetState())
		}
		return err
	})
	// A run opened, and closed, by writes whose replies were lost.
	open := budget.OpenRunParams{RunID: "r2", TenantID: "ten", Limit: 1000, MinReservation: 10,
		Tasks: []budget.TaskBudget{{TaskID: "a", Limit: 100}}}
	step("open run", commit, func() error {
		_, accounts, created, err := rs.OpenRun(ctx, draftRun("r2", "ten", "k2", "a"), "n", open, nil, nil, []string{"a"}, nil)
		switch {
		case err == nil && !created:
			err = errors.New("created false: it reports its own run as another's")
		case err == nil && (accounts.Run.ID == 0 || accounts.Tasks["a"] == 0):
			err = fmt.Errorf("returned accounts %+v, want the run's", accounts)
		}
		return err
	})
	step("close run", commit, func() error {
		c, err := rs.CloseRun(ctx, "r2", "n", 0, fanoutv1.RunState_RUN_STATE_SUCCEEDED, "", &fanoutv1.JoinedResult{})
		switch {
		case err == nil && (!c.Ended || c.Account == nil || c.Account.State != budget.StateClosed):
			err = fmt.Errorf("ended %v, account %+v: it reports its own end as another's", c.Ended, c.Account)
		case err == nil && c.Run.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED:
			err = fmt.Errorf("returned the run %v, want it as stored, SUCCEEDED", c.Run)
		}
		return err
	})
	for _, c := range []struct {
		run, kind string
		want      int
	}{{"r1", "task_started", 1}, {"r1", "run_finished", 1}, {"r2", "run_started", 1}, {"r2", "budget_update", 1}, {"r2", "run_finished", 1}} {
		var n int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM run_event WHERE run_id = $1 AND event ? $2`, c.run, c.kind).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != c.want {
			t.Errorf("run %s: %d %s events, want %d", c.run, n, c.kind, c.want)
		}
	}
}

// TestRefundWhoseReplyIsLostIsNotRetried: a rate limit refund is not
// idempotent (a second credit would let more through than the limit), so
// an ambiguous error is returned, not retried: the bucket is credited once.
func TestRefundWhoseReplyIsLostIsNotRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, pool := newCutProxy(t, b.url)
	lim := store.NewRateLimiter(pool, store.RateLimiterConfig{Logger: quiet})
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := lim.Define(ctx, "k", 0, 60, time.Hour); err != nil { // 1 token/s, capacity 3,600
		t.Fatal(err)
	}
	proxy.arm(bind)
	err := lim.Refund(ctx, "k", 1000)
	checkCut(t, proxy)
	if err == nil {
		t.Error("refund whose reply was lost: no error; want the ambiguous error, since it cannot be retried")
	}
	var tokens float64
	if err := b.pool.QueryRow(ctx, `SELECT tokens FROM rate_bucket WHERE bucket = 'k'`).Scan(&tokens); err != nil {
		t.Fatal(err)
	}
	if tokens < 1000 || tokens >= 2000 {
		t.Errorf("bucket holds %.0f tokens after one refund of 1000, want 1000 plus a few seconds' refill", tokens)
	}
}

// TestAReadOfAnUnreachableDatabaseIsUnavailable: a read whose database
// went away (its connection killed, new ones refused) is tried until the
// caller's deadline, then fails as budget.ErrUnavailable (the API's
// UNAVAILABLE), before that deadline.
func TestAReadOfAnUnreachableDatabaseIsUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, pool := newCutProxy(t, b.url)
	rs := store.NewRuns(pool, store.RunsConfig{Logger: quiet})
	var pid int
	if err := pool.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	_ = proxy.lis.Close() // new connections are refused from now on
	if _, err := b.pool.Exec(b.ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 500*time.Millisecond)
	defer cancel()
	_, err := rs.Head(ctx, "ten", "r1")
	if !errors.Is(err, budget.ErrUnavailable) {
		t.Fatalf("a read of a database that went away: %v, want budget.ErrUnavailable", err)
	}
	if ctx.Err() != nil {
		t.Errorf("the read returned after its caller's deadline")
	}
}
