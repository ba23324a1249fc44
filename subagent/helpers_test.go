package subagent_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm"
)

func TestMain(m *testing.M) {
	storetest.MigrateFunc = store.Migrate
	storetest.Main(m)
	if err := goleak.Find(); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
		os.Exit(1)
	}
}

// patience bounds every wait in these tests that must end by itself: one
// that has not ended by then fails, saying what did not happen, instead of
// hanging until the package timeout. It is generous (the machine may be
// busy); the tests' claims are orderings, not speeds.
const patience = 20 * time.Second

// await returns what ch delivers, or fails t saying what did not happen.
func await[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(patience)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("%s: not within %v", what, patience)
		var zero T
		return zero
	}
}

// goRun runs loop.Run(ctx, task) in the background and returns a wait for
// its summary that fails t, saying what did not happen, if the run has not
// ended within patience. If the test ends first, the run's context is
// cancelled and the run waited for, so it never outlives the test.
func goRun(t *testing.T, ctx context.Context, loop *subagent.Loop, task subagent.Task) (wait func(what string) subagent.Summary) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	finished := make(chan struct{})
	var sum subagent.Summary
	go func() {
		defer close(finished)
		sum = loop.Run(ctx, task)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-finished:
		case <-time.After(patience):
			t.Errorf("the loop did not return within %v of its context being cancelled", patience)
		}
	})
	return func(what string) subagent.Summary {
		t.Helper()
		await(t, finished, what)
		return sum
	}
}

// backstop is how long within's contexts last: longer than patience, so
// that a test's own wait for what should have happened fails first, and
// names it.
const backstop = 2 * patience

// within returns a context that ends after backstop, for a call or stream
// that must end by itself (t.Context ends only with the test).
func within(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), backstop)
	t.Cleanup(cancel)
	return ctx
}

// bundle is one test's ledger with one open run.
type bundle struct {
	url    string
	pool   *pgxpool.Pool
	ledger *store.Ledger
	runID  string
	accts  budget.RunAccounts
}

// setup opens a run with the given limit and min reservation and one task
// account per entry of tasks (task id -> limit).
func setup(t *testing.T, limit, minRes int64, tasks map[string]int64) *bundle {
	t.Helper()
	url := storetest.NewDB(t)
	pool, err := store.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// Group commit on, as a worker runs by default (issue 41): the loop's
	// reserves and settles take the batch path a real worker takes.
	b := &bundle{url: url, pool: pool, ledger: store.NewLedger(pool, store.LedgerConfig{Coalesce: true}), runID: "run1"}
	t.Cleanup(b.ledger.Close) // before the pool's close: cleanups run last first
	p := budget.OpenRunParams{RunID: b.runID, TenantID: "t1", Limit: limit, MinReservation: minRes}
	for id, l := range tasks {
		p.Tasks = append(p.Tasks, budget.TaskBudget{TaskID: id, Limit: l})
	}
	if b.accts, err = b.ledger.OpenRun(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	// As the orchestrator does before it dispatches: attempt 1 of every
	// task (and of the run's synthesis, on the run account).
	ids := []budget.AccountID{b.accts.Run.ID}
	for _, id := range b.accts.Tasks {
		ids = append(ids, id)
	}
	for _, id := range ids {
		if _, err := b.ledger.BeginAttempt(t.Context(), id, b.runID, "t1"); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// account returns a task account's row.
func (b *bundle) account(t *testing.T, taskID string) budget.Account {
	t.Helper()
	a, err := b.ledger.Account(context.Background(), b.accts.Tasks[taskID])
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// reservation is a row of the reservation table.
type reservation struct {
	ID        int64
	State     string
	Amount    int64
	Actual    *int64
	Spent     int64
	Estimated bool
	Overrun   int64
	Key       string
}

func (b *bundle) reservations(t *testing.T) []reservation {
	t.Helper()
	rows, err := b.pool.Query(context.Background(),
		`SELECT reservation_id, state, amount, actual, spent, estimated, overrun, coalesce(reserve_key, '')
		   FROM reservation ORDER BY reservation_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []reservation
	for rows.Next() {
		var r reservation
		if err := rows.Scan(&r.ID, &r.State, &r.Amount, &r.Actual, &r.Spent, &r.Estimated, &r.Overrun, &r.Key); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkLedger checks conservation on every account and that nothing is
// held. The view must report on every account of the run: an account it
// does not list is not shown conserved.
func (b *bundle) checkLedger(t *testing.T) {
	t.Helper()
	ids := []int64{int64(b.accts.Run.ID)}
	for _, id := range b.accts.Tasks {
		ids = append(ids, int64(id))
	}
	var listed, accounts, held int
	var bad []int64
	err := b.pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM conservation_check WHERE account_id = ANY ($1)),
		(SELECT count(*) FROM account),
		(SELECT coalesce(array_agg(account_id ORDER BY account_id), '{}') FROM conservation_check WHERE NOT conserved),
		(SELECT count(*) FROM reservation WHERE state = 'held')`, ids).Scan(&listed, &accounts, &bad, &held)
	if err != nil {
		t.Fatal(err)
	}
	if listed != len(ids) {
		t.Errorf("conservation_check lists %d of the run's %d accounts", listed, len(ids))
	}
	if len(bad) != 0 {
		t.Errorf("accounts %v are not conserved (of %d)", bad, accounts)
	}
	if held != 0 {
		t.Errorf("%d reservations are still held", held)
	}
}

// newSim returns a Sim with cfg, failing t on error.
func newSim(t *testing.T, cfg llm.SimConfig) *llm.Sim {
	t.Helper()
	s, err := llm.NewSim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// gatedModel holds every call until the test releases it.
type gatedModel struct {
	llm.Model
	started chan llm.Meta // receives each call's metadata as it starts
	release chan struct{} // one receive lets one call proceed; close to let all through
	mu      sync.Mutex
	reqs    []llm.Request
}

func newGated(inner llm.Model) *gatedModel {
	return &gatedModel{Model: inner, started: make(chan llm.Meta, 64), release: make(chan struct{})}
}

func (g *gatedModel) Call(ctx context.Context, req llm.Request) (llm.Response, error) {
	g.mu.Lock()
	g.reqs = append(g.reqs, req)
	g.mu.Unlock()
	g.started <- req.Meta
	select {
	case <-g.release:
	case <-ctx.Done():
		return llm.Response{}, context.Cause(ctx)
	}
	return g.Model.Call(ctx, req)
}

func (g *gatedModel) requests() []llm.Request {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]llm.Request(nil), g.reqs...)
}

// waitStarted returns the next call's metadata or fails t.
func waitStarted(t *testing.T, g *gatedModel) llm.Meta {
	t.Helper()
	select {
	case m := <-g.started:
		return m
	case <-time.After(patience):
		t.Fatalf("no model call started within %v", patience)
		return llm.Meta{}
	}
}

// chanWatch is a RunWatch the test fires by hand, standing in for the
// watcher's LISTEN/NOTIFY delivery so the test controls when it arrives.
// Like budget.Subscription, the first signal is kept, and a cancelled or
// closed run (first, or after exhaustion) also closes Cancelled.
type chanWatch struct {
	once, cancelOnce sync.Once
	done, cancelled  chan struct{}
	sig, cancelSig   budget.RunSignal
}

func newWatch() *chanWatch {
	return &chanWatch{done: make(chan struct{}), cancelled: make(chan struct{})}
}

func (w *chanWatch) fire(sig budget.RunSignal) {
	w.once.Do(func() {
		w.sig = sig
		close(w.done)
	})
	if sig.State == budget.StateCancelled || sig.State == budget.StateClosed {
		w.cancelOnce.Do(func() {
			w.cancelSig = sig
			close(w.cancelled)
		})
	}
}

func (w *chanWatch) Done() <-chan struct{} { return w.done }

func (w *chanWatch) Signal() budget.RunSignal {
	<-w.done
	return w.sig
}

func (w *chanWatch) Cancelled() <-chan struct{} { return w.cancelled }

func (w *chanWatch) CancelSignal() budget.RunSignal {
	<-w.cancelled
	return w.cancelSig
}

// poll calls cond until it holds or patience runs out.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", patience, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
