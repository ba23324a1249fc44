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
	b := &bundle{url: url, pool: pool, ledger: store.NewLedger(pool), runID: "run1"}
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

// checkLedger checks conservation on every account and that nothing is held.
func (b *bundle) checkLedger(t *testing.T) {
	t.Helper()
	var bad, held int
	err := b.pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM conservation_check WHERE NOT conserved),
		(SELECT count(*) FROM reservation WHERE state = 'held')`).Scan(&bad, &held)
	if err != nil {
		t.Fatal(err)
	}
	if bad != 0 {
		t.Errorf("%d accounts are not conserved", bad)
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
	case <-time.After(10 * time.Second):
		t.Fatal("no model call started")
		return llm.Meta{}
	}
}

// chanWatch is a RunWatch the test fires by hand, standing in for the
// watcher's LISTEN/NOTIFY delivery so the test controls when it arrives.
type chanWatch struct {
	once sync.Once
	done chan struct{}
	sig  budget.RunSignal
}

func newWatch() *chanWatch { return &chanWatch{done: make(chan struct{})} }

func (w *chanWatch) fire(sig budget.RunSignal) {
	w.once.Do(func() {
		w.sig = sig
		close(w.done)
	})
}

func (w *chanWatch) Done() <-chan struct{} { return w.done }

func (w *chanWatch) Signal() budget.RunSignal {
	<-w.done
	return w.sig
}

// poll calls cond until it holds or 10 seconds pass.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
